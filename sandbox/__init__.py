"""The jail: run commands, Python blocks and ast-grep actions inside nsjail, failing closed.

Imports only the stdlib and pydantic (PyYAML lazily, to read configs/sandbox.yaml).
See docs/sandbox.md for what the jail allows and forbids.
"""

from sandbox.astgrep import (
    AstGrepAction,
    AstGrepResult,
    ParseCheck,
    apply_astgrep,
    apply_astgrep_async,
    check_parses_async,
)
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.jail import Bind, ensure_available, find_nsjail, run, run_async
from sandbox.models import (
    SandboxConfig,
    SandboxLimits,
    SandboxResult,
    default_config,
    load_config,
)
from sandbox.python_block import (
    PythonBlockError,
    PythonBlockResult,
    python_runtime,
    run_python_block,
    run_python_block_async,
)

__all__ = [
    "AstGrepAction",
    "AstGrepResult",
    "Bind",
    "ParseCheck",
    "PythonBlockError",
    "PythonBlockResult",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "apply_astgrep",
    "apply_astgrep_async",
    "check_parses_async",
    "default_config",
    "ensure_available",
    "find_nsjail",
    "load_config",
    "python_runtime",
    "run",
    "run_async",
    "run_python_block",
    "run_python_block_async",
]
