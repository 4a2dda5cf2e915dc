"""Runs INSIDE the jail (never imported by the host): execute one Python block.

The host puts this file, the block's source and a spec (inputs and declared output
names) under the read-only /keel. The block runs with only its inputs bound; then only
the declared outputs are written, as JSON, to the result path in the workspace. Errors
come back structured. Kept to plain syntax (3.6+): the jail's interpreter may be an older
Python than the host's.
"""

import json
import sys

SPEC_PATH = "/keel/spec.json"
BLOCK_PATH = "/keel/block.py"
MAX_TRACEBACK = 4000
MAX_MESSAGE = 2000


def _error(kind, message, tb=""):
    return {
        "ok": False,
        "error": {
            "type": kind,
            "message": message[:MAX_MESSAGE],
            # Keep the end: the innermost frames say where it failed.
            "traceback": tb[-MAX_TRACEBACK:],
        },
    }


def _format_block_exception(exc):
    # Imported here: traceback costs about 3 ms of every block's start-up, and only a
    # failing block needs it.
    import traceback

    tb = exc.__traceback__
    # Drop this runner's own frame so the trace starts in the block.
    if tb is not None:
        tb = tb.tb_next
    if tb is None:
        # Raised before any block frame ran (a SyntaxError from compile()).
        return "".join(traceback.format_exception_only(type(exc), exc))
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _run(spec, source):
    names = spec["outputs"]
    scope = {"__name__": "__block__", "__builtins__": __builtins__}
    scope.update(spec["inputs"])
    try:
        code = compile(source, BLOCK_PATH, "exec")
        exec(code, scope)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are reported too
        return _error(type(exc).__name__, str(exc), _format_block_exception(exc))
    outputs = {}
    for name in names:
        if name not in scope:
            return _error("MissingOutput", f"declared output {name!r} was not set by the block")
        value = scope[name]
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return _error(
                "OutputNotSerializable",
                f"output {name!r} ({type(value).__name__}) is not JSON-serialisable: {exc}",
            )
        outputs[name] = value
    return {"ok": True, "outputs": outputs}


def main():
    with open(SPEC_PATH, encoding="utf-8") as f:
        spec = json.load(f)
    with open(BLOCK_PATH, encoding="utf-8") as f:
        source = f.read()
    result = _run(spec, source)
    data = json.dumps(result, allow_nan=False)
    with open(spec["result_path"], "w", encoding="utf-8") as f:
        f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
