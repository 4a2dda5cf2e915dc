"""Look for a secret everywhere an operator could read its own environment: ``os.environ``,
``os.getenv``, ``/proc/self/environ`` and a child process's environment. Counts come out as
numbers (so ``numeric-sum`` adds them over the shards); 0 means not seen."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext


class EnvProbe(AgentBase):
    """``params.secret``: the value to look for; ``params.name``: the variable that holds
    it in the worker; ``params.declared``: a variable the operator.yaml declares."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        secret = str(ctx.params["secret"])
        name = str(ctx.params["name"])
        declared = str(ctx.params["declared"])
        in_environ = int(name in os.environ or any(secret in v for v in os.environ.values()))
        in_getenv = int(os.getenv(name) is not None)
        proc = Path("/proc/self/environ").read_bytes()
        in_proc = int(secret.encode() in proc)
        names = sorted(os.environ)
        return {
            "shards": 1,
            "secret_in_environ": in_environ,
            "secret_in_getenv": in_getenv,
            "secret_in_proc_self_environ": in_proc,
            "declared_seen": int(os.environ.get(declared) == ctx.params.get("declared_value")),
            "declared_in_ctx_env": int(ctx.env.get(declared) == ctx.params.get("declared_value")),
            "undeclared_names": len([n for n in names if n != declared]),
            "proc_names": len([e for e in proc.split(b"\0") if e]),
            "pid_is_worker": int(os.getpid() == int(str(ctx.params.get("worker_pid", -1)))),
        }
