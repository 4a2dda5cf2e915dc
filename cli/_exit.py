"""Clean exits for CLI entry points.

Short Python programs that used the Temporal client crash at interpreter shutdown about
a third of the time (``PyGILState_Release``, sdk-python issue 300), when the Rust core's
threads outlive the interpreter. Entry points (``toolkit.Family.main``) therefore run
the app with :func:`run_app`, which flushes, and leave with ``os._exit``, skipping the
shutdown that races those threads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable

import click
import typer


def run_app(
    app: typer.Typer,
    argv: list[str] | None = None,
    *,
    on_error: Callable[[BaseException], int] | None = None,
) -> int:
    """Run ``app`` and return its exit code, whatever it raised.

    ``on_error`` (optional) reports usage errors and unexpected exceptions itself and
    returns the exit code (the toolkit's family errors).
    """
    code = 0
    try:
        result = app(args=argv, standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        sys.stderr.write("Aborted.\n")
        code = 130
    except click.ClickException as e:
        if on_error is not None:
            code = on_error(e)
        else:
            e.show()
            code = e.exit_code
    except typer.exceptions.TyperException as e:
        # Typer 0.29 raises its own copy of click's usage errors, which the clause above
        # does not catch: report them the same way (usage message, exit code 2).
        if on_error is not None:
            code = on_error(e)
        else:
            show = getattr(e, "show", None)
            if callable(show):
                show()
            code = int(getattr(e, "exit_code", 2))
    except KeyboardInterrupt:
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:
        # Bad settings, unreachable servers...: one clear line, the traceback on request.
        if os.environ.get("KEEL_DEBUG"):
            traceback.print_exc()
        if on_error is not None:
            code = on_error(e)
        else:
            sys.stderr.write(
                f"error: {type(e).__name__}: {e}\n(set KEEL_DEBUG=1 for a traceback)\n"
            )
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    return code
