"""Models of the sandbox: limits, results, and the configuration in ``configs/sandbox.yaml``.

Everything here is plain data; nothing touches the system. Defaults are deliberately
small: a caller that needs more asks for it per run with ``limits.model_copy(update=...)``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Default location of the YAML file; ``KEEL_SANDBOX_CONFIG`` (``Settings.sandbox_config``,
#: passed in through :func:`config_for`) points elsewhere.
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "configs" / "sandbox.yaml"


class SandboxLimits(BaseModel):
    """Resource limits of one jailed run.

    ``memory_mb`` bounds the jail as a whole through its memory cgroup (every process,
    memfds and its tmpfs files together) and, as RLIMIT_AS, each process's address
    space; ``max_processes`` bounds the jail's pids cgroup and RLIMIT_NPROC (counted
    inside the jail's own user namespace, so concurrent jails do not share it). Without
    cgroups (``jail.cgroups``) only the per-process limits hold.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_time_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit of the run")
    cpu_time_s: int = Field(10, ge=1, le=3600, description="RLIMIT_CPU per process, seconds")
    memory_mb: int = Field(
        512, ge=16, le=262_144, description="memory cgroup of the jail and RLIMIT_AS, MiB"
    )
    max_processes: int = Field(
        32, ge=1, le=4096, description="pids cgroup of the jail and RLIMIT_NPROC"
    )
    max_file_size_mb: int = Field(16, ge=1, le=65_536, description="RLIMIT_FSIZE, MiB")
    max_open_files: int = Field(64, ge=8, le=65_536, description="RLIMIT_NOFILE")
    max_output_bytes: int = Field(
        1_000_000, ge=1024, le=1 << 30, description="cap on each of stdout and stderr"
    )
    tmpfs_size_mb: int = Field(16, ge=1, le=65_536, description="size of /tmp inside the jail")
    workspace_size_mb: int = Field(
        64, ge=1, le=65_536, description="size of the workspace when it is a tmpfs"
    )


#: The limit that ended a run (``SandboxResult.limit``).
LimitName = Literal["wall", "cpu", "memory", "output"]


class SandboxResult(BaseModel):
    """What came back from one jailed run.

    ``timed_out`` is true when the run was killed for time: the wall-clock limit (ours or
    nsjail's) or the CPU limit (the kernel's SIGKILL at RLIMIT_CPU); a SIGKILL while the
    jail was at its memory limit is read as the OOM kill instead (``memory_limit_hit``). ``killed_by_signal``
    is the signal that ended the jailed program, if one did. ``files`` holds the declared
    output files that could be collected; ``refused_files`` says why others could not
    (missing, a symlink, not a regular file, too large).
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    killed_by_signal: int | None = None
    output_truncated: bool = False
    #: The jail ran into its memory cgroup limit: an allocation had to wait for reclaim or
    #: failed, and a process may have been OOM-killed (pid 1 so killed reads as
    #: ``killed_by_signal=9`` with ``timed_out=False``). Always False without cgroups.
    memory_limit_hit: bool = False
    #: The limit that ended the run, told apart by who stopped it rather than by how long
    #: it ran: "wall" (our wall-clock timer, or nsjail's backstop by its log line), "cpu"
    #: (the kernel's SIGKILL of pid 1 at RLIMIT_CPU: a SIGKILL neither we nor nsjail
    #: sent, outside a memory-limit hit), "memory" (pid 1 SIGKILLed while the jail was at
    #: its memory cgroup limit), "output" (stdout or stderr past ``max_output_bytes``:
    #: we stopped the jail). None when the program ended by itself or by another signal.
    #: ``timed_out`` is ``limit in ("wall", "cpu")``.
    limit: LimitName | None = None
    duration_ms: int = 0
    files: dict[str, bytes] = Field(default_factory=dict)
    refused_files: dict[str, str] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the program exited by itself with status 0."""
        return (
            self.exit_code == 0
            and not self.timed_out
            and self.killed_by_signal is None
            and not self.output_truncated
        )


class JailSettings(BaseModel):
    """How the jail is built. Changing these weakens or strengthens every run."""

    model_config = ConfigDict(extra="forbid")

    #: Host uid/gid the jailed uid 1000 maps to when the host process is root. When it
    #: is not root, the kernel only allows mapping one's own ids, so those are used.
    outside_uid: int = Field(99999, ge=1)
    outside_gid: int = Field(99999, ge=1)
    hostname: str = "keel-sandbox"
    #: System directories bound read-only. A host path that is a symlink (merged /usr)
    #: becomes the same symlink inside; a missing one is skipped.
    system_mounts: list[str] = Field(
        default_factory=lambda: ["/usr", "/lib", "/lib64", "/bin", "/sbin"]
    )
    #: The only host files of /etc the jail sees (passwd and group are synthetic).
    etc_files: list[str] = Field(
        default_factory=lambda: ["/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"]
    )
    #: Deny-list seccomp policy (namespaces, mount, ptrace, bpf, keyrings, ...).
    seccomp: bool = True
    #: The workspace as a size-limited tmpfs mounted on the host (needs root):
    #: "auto" uses it when possible, "always" fails closed without it, "never" uses a
    #: plain directory (then only RLIMIT_FSIZE bounds what a run may write).
    workspace_tmpfs: Literal["auto", "always", "never"] = "auto"
    #: Memory and pids cgroups bounding each jail as a whole: "auto" requires them when
    #: the host process is root (fails closed with SandboxUnavailable) and, for other
    #: users, goes without them with a warning; "always" fails closed for everyone;
    #: "never" leaves only the per-process rlimits.
    cgroups: Literal["auto", "always", "never"] = "auto"
    #: Where run directories are made; default: the system temp dir.
    base_dir: str | None = None


class PythonSettings(BaseModel):
    """Which interpreter runs Python inside the jail."""

    model_config = ConfigDict(extra="forbid")

    #: Explicit interpreter; default: this process's interpreter when the jail can
    #: reach it, else the first usable fallback.
    interpreter: str | None = None
    #: Also mount this process's virtual environment (read-only) so blocks can import
    #: its packages. Only used with this process's own interpreter.
    include_venv: bool = True
    fallback_interpreters: list[str] = Field(default_factory=lambda: ["/usr/bin/python3"])


class AstGrepSettings(BaseModel):
    """Where the ast-grep binary is; default: next to this interpreter, else PATH."""

    model_config = ConfigDict(extra="forbid")

    binary: str | None = None
    threads: int = Field(1, ge=1, le=64)


class SandboxConfig(BaseModel):
    """The whole of ``configs/sandbox.yaml``."""

    model_config = ConfigDict(extra="forbid")

    nsjail_path: str | None = None
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    jail: JailSettings = Field(default_factory=JailSettings)
    python: PythonSettings = Field(default_factory=PythonSettings)
    astgrep: AstGrepSettings = Field(default_factory=AstGrepSettings)


def load_config(path: str | os.PathLike[str] | None = None) -> SandboxConfig:
    """Read a sandbox config file; built-in defaults when the default file is absent.

    An explicitly named file that does not exist is an error rather than a silent
    fall-back to defaults: a typo in the path must not quietly change the limits.
    """
    explicit = path is not None
    target = Path(path or DEFAULT_CONFIG_PATH)
    if not target.is_file():
        if explicit:
            raise FileNotFoundError(f"sandbox config not found: {target}")
        return SandboxConfig()
    # PyYAML is imported here, not at module top, so the rest of sandbox/ stays
    # stdlib + pydantic; it is a declared project dependency used only as a parser.
    import yaml

    data: Any = yaml.safe_load(target.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{target}: expected a mapping at the top level")
    return SandboxConfig.model_validate(data)


def config_for(
    path: str | os.PathLike[str] | None = None, nsjail_path: str | os.PathLike[str] | None = None
) -> SandboxConfig:
    """The config a process runs with: the file ``path`` (``KEEL_SANDBOX_CONFIG``, else
    the default file), with ``nsjail_path`` (``KEEL_NSJAIL_PATH``) over the file's own.

    The caller reads both from ``keel.settings.Settings``: this package reads no
    environment, so it stays importable without the rest of Keel.
    """
    cfg = load_config(path)
    if nsjail_path:
        cfg = cfg.model_copy(update={"nsjail_path": str(nsjail_path)})
    return cfg


@lru_cache(maxsize=1)
def default_config() -> SandboxConfig:
    """The process-wide config (read once)."""
    return load_config()
