"""Host side of a jailed run: its private directory, the workspace, and output collection.

Layout of one run directory (``<base>/keel-sandbox-<euid>/run-<pid>-<random>/``)::

    work/        the workspace, bound read-write at /work inside the jail; when the host
                 process is root it is a size-limited tmpfs mounted here, so a run cannot
                 fill the host disk with many small files
    ro/          read-only files for the jail (runner script, inputs, passwd), at /keel
    nsjail.log   nsjail's own log; never visible inside the jail

The run directory, ro/ and work/ are mode 0700 (files in ro/ 0400), owned by the host
uid the jail runs as: no other host user can read a run's inputs or outputs.

Everything the jail wrote is untrusted. Output files are opened component by component
with ``O_NOFOLLOW`` relative to the workspace, so a symlink planted by the jailed program
can never make the host read (or follow into) anything outside the workspace.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.models import JailSettings, SandboxLimits

log = logging.getLogger(__name__)

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
_MAX_PATH_LEN = 1024
_RUN_DIR_RE = re.compile(r"^run-(\d+)-")
_swept_bases: set[str] = set()
_warned_plain = [False]  # warn once per process, not once per run


def validate_relpath(path: str) -> PurePosixPath:
    """Check that ``path`` names something inside the workspace, and normalise it.

    Refused: empty paths, absolute paths, any ``..`` component, NUL bytes, overlong
    paths. ``.`` components and repeated slashes are dropped.
    """
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > _MAX_PATH_LEN:
        raise SandboxError(f"invalid workspace path: {path!r}")
    if path.startswith("/"):
        raise SandboxError(f"workspace path must be relative: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise SandboxError(f"workspace path names the workspace itself: {path!r}")
    if ".." in parts:
        raise SandboxError(f"workspace path escapes the workspace: {path!r}")
    return PurePosixPath(*parts)


def unreachable_reason(path: str, *, need_read: bool = True) -> str | None:
    """Why the jail could not bind ``path`` (None when it can).

    nsjail resolves bind sources as a user without rights over host-owned files, so
    every directory on the way needs o+x and the target o+r (``need_read``; for a
    directory, o+x too). Checking first turns nsjail's terse mount error into a
    message that names the path and the fix.
    """
    p = Path(os.path.abspath(path))
    if not p.exists():
        return f"{p} does not exist"
    if os.geteuid() != 0:
        # Unprivileged: the jail's mount setup keeps our own uid, so our own access
        # rights are what count.
        return None if os.access(p, os.R_OK if need_read else os.X_OK) else f"{p}: no access"
    for anc in reversed(p.parents):
        if not os.stat(anc).st_mode & 0o001:
            return f"{anc} is not o+x, so the jail cannot reach {p}"
    mode = os.stat(p).st_mode
    is_dir = stat.S_ISDIR(mode)
    if (need_read and not mode & 0o004) or (is_dir and not mode & 0o001):
        return f"{p} is not {'readable' if need_read else 'traversable'} by others"
    return None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def tmpfs_inodes(size_mb: int) -> int:
    """Inode cap of a tmpfs of ``size_mb``: 256 per MiB, between 1,024 and 1 Mi.

    A tmpfs counts empty files against no size limit, only against ``nr_inodes``, whose
    default is half the host's RAM pages (millions): without this cap a run could pin
    host memory in inodes and dentries.
    """
    return max(1024, min(size_mb * 256, 1 << 20))


def _mount_tmpfs(target: Path, size_mb: int, uid: int, gid: int) -> None:
    """Mount a size- and inode-limited tmpfs at ``target`` (host side; needs root)."""
    opts = f"size={size_mb}m,nr_inodes={tmpfs_inodes(size_mb)},mode=0700,uid={uid},gid={gid}"
    rc = _libc().mount(
        b"keel-sandbox", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs at {target}: {os.strerror(err)}")


def _umount(target: Path) -> None:
    # MNT_DETACH: a process still holding a file open must not keep the mount (and the
    # memory behind it) pinned to the host's mount table.
    if _libc().umount2(os.fsencode(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            log.warning("could not unmount sandbox tmpfs %s: %s", target, os.strerror(err))


def _rmtree(path: Path) -> None:
    """Remove a tree the jail may have made hard to remove (dirs with mode 000).

    Only what lies inside ``path`` is ever made writable: ``path``'s own parent is the
    shared base directory, which must keep its o+x for every other process's jails, and
    two processes may sweep the same stale run directory at once, so one that finds it
    already gone is done.
    """
    top = os.fspath(path)

    def fix_and_retry(func, p, exc_info):  # type: ignore[no-untyped-def]
        if isinstance(exc_info[1], FileNotFoundError):
            return
        try:
            parent = os.path.dirname(p)
            if p != top and (parent == top or parent.startswith(top + os.sep)):
                os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix_and_retry)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _secure_base(settings: JailSettings) -> Path:
    """The per-user base directory, refusing one that someone else could tamper with."""
    root = Path(settings.base_dir or tempfile.gettempdir())
    base = root / f"keel-sandbox-{os.geteuid()}"
    try:
        base.mkdir(mode=0o711, exist_ok=True)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot create sandbox base dir {base}: {exc}") from exc
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxUnavailable(
            f"sandbox base dir {base} is not a directory owned by this user and "
            "writable only by it; refusing to use it"
        )
    # The jail's mount setup runs as an unmapped user, so it needs o+x on the way to
    # the run directories (never o+r: other users must not list them).
    os.chmod(base, 0o711)
    reason = unreachable_reason(str(base), need_read=False)
    if reason:
        raise SandboxUnavailable(f"sandbox base dir unusable: {reason}")
    if str(base) not in _swept_bases:
        _swept_bases.add(str(base))
        _sweep_stale(base)
    return base


def _sweep_stale(base: Path) -> None:
    """Remove run directories left by processes that died mid-run (e.g. a SIGKILLed worker)."""
    for entry in base.iterdir():
        m = _RUN_DIR_RE.match(entry.name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        work = entry / "work"
        if os.path.ismount(work):
            _umount(work)
        _rmtree(entry)


class Workspace:
    """One run's private directory on the host. Use as a context manager."""

    def __init__(self, settings: JailSettings, limits: SandboxLimits) -> None:
        self.settings = settings
        self.limits = limits
        self.is_root = os.geteuid() == 0
        #: Host ids that the jailed uid/gid 1000 map to.
        self.outside_uid = settings.outside_uid if self.is_root else os.geteuid()
        self.outside_gid = settings.outside_gid if self.is_root else os.getegid()
        base = _secure_base(settings)
        # Private to the jail's host user: the run's inputs are under ro/, and its path
        # is on nsjail's command line for every host user to see. Owned by the jail's
        # host uid, the jail's mount setup (which holds capabilities only over files of
        # the ids it maps) can still reach it, and so can the jailed program.
        self.root = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base))
        self.work = self.root / "work"
        self.ro = self.root / "ro"
        self.log_path = self.root / "nsjail.log"
        self.tmpfs = False
        try:
            self._own(self.root)
            self.work.mkdir(mode=0o700)
            self.ro.mkdir(mode=0o700)
            self._own(self.ro)
            self._setup_work()
            self._write_identity()
        except BaseException:
            self.cleanup()
            raise

    def _own(self, path: Path) -> None:
        """Give ``path`` to the jail's host user (a root host), with owner-only access."""
        os.chmod(path, 0o700 if path.is_dir() else 0o400)
        if self.is_root:
            os.chown(path, self.outside_uid, self.outside_gid)

    def _setup_work(self) -> None:
        mode = self.settings.workspace_tmpfs
        if mode != "never" and self.is_root:
            try:
                _mount_tmpfs(
                    self.work, self.limits.workspace_size_mb, self.outside_uid, self.outside_gid
                )
                self.tmpfs = True
                return
            except OSError as exc:
                if mode == "always":
                    raise SandboxUnavailable(
                        f"workspace_tmpfs=always but the tmpfs cannot be mounted: {exc}"
                    ) from exc
                log.warning("sandbox workspace is a plain directory (%s)", exc)
        elif mode == "always":
            raise SandboxUnavailable(
                "workspace_tmpfs=always needs a root host process to mount the tmpfs"
            )
        elif mode == "auto" and not _warned_plain[0]:
            _warned_plain[0] = True
            log.warning(
                "sandbox workspace is a plain directory (host process is not root): "
                "only RLIMIT_FSIZE bounds what a run writes there"
            )
        if self.is_root:
            os.chown(self.work, self.outside_uid, self.outside_gid)

    def _write_identity(self) -> None:
        # Synthetic account files: tools that look up their own user work, and the
        # host's real passwd and group never enter the jail.
        self.add_readonly_file(
            "passwd",
            b"root:x:0:0:root:/root:/bin/false\n"
            b"sandbox:x:1000:1000:sandbox:/work:/bin/sh\n"
            b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )
        self.add_readonly_file("group", b"root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n")

    def add_readonly_file(self, name: str, data: bytes | str) -> None:
        """Put a file into the read-only directory the jail sees at /keel."""
        rel = validate_relpath(name)
        target = self.ro / rel
        for parent in reversed(target.parents):
            if parent.is_relative_to(self.ro) and parent != self.ro and not parent.exists():
                parent.mkdir(mode=0o700)
                self._own(parent)
        # Replaced, not rewritten: the old file is read-only to its owner.
        target.unlink(missing_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        self._own(target)

    def write_files(self, files: Mapping[str, bytes | str]) -> None:
        """Write the starting contents of the workspace (before anything untrusted ran)."""
        budget = self.limits.workspace_size_mb * 1024 * 1024
        total = 0
        for name, data in files.items():
            rel = validate_relpath(name)
            raw = data.encode() if isinstance(data, str) else bytes(data)
            total += len(raw)
            if total > budget:
                raise SandboxError(
                    f"workspace files exceed workspace_size_mb={self.limits.workspace_size_mb}"
                )
            target = self.work / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(raw)
            except OSError as exc:
                raise SandboxError(f"cannot write workspace file {name!r}: {exc}") from exc
        if self.is_root:
            # Files written by root would be unmapped (read-only "nobody") inside.
            for dirpath, dirnames, filenames in os.walk(self.work):
                for n in (*dirnames, *filenames):
                    os.lchown(os.path.join(dirpath, n), self.outside_uid, self.outside_gid)

    def collect(
        self, paths: Iterable[PurePosixPath], max_bytes: int
    ) -> tuple[dict[str, bytes], dict[str, str]]:
        """Read declared output files without following anything the jail planted.

        Returns (files, refused): refused maps a path to the reason it was not read.
        """
        files: dict[str, bytes] = {}
        refused: dict[str, str] = {}
        for rel in paths:
            key = rel.as_posix()
            try:
                files[key] = _read_beneath(self.work, rel, max_bytes)
            except _Refused as exc:
                refused[key] = str(exc)
        return files, refused

    def cleanup(self) -> None:
        """Unmount and remove the run directory; safe to call twice."""
        if self.tmpfs:
            _umount(self.work)
            self.tmpfs = False
        if self.root.exists():
            _rmtree(self.root)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class _Refused(Exception):
    pass


def _read_beneath(root: Path, rel: PurePosixPath, max_bytes: int) -> bytes:
    """Open ``root/rel`` one component at a time, never following a symlink."""
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(root, flags_dir))
        for part in rel.parts[:-1]:
            try:
                fds.append(os.open(part, flags_dir, dir_fd=fds[-1]))
            except FileNotFoundError:
                raise _Refused("missing") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _Refused(f"{part!r} is a symlink or not a directory") from None
                raise _Refused(f"cannot open {part!r}: {exc.strerror}") from None
        # O_NONBLOCK: opening a FIFO the jail left behind must not hang the host.
        flags_file = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(rel.parts[-1], flags_file, dir_fd=fds[-1])
        except FileNotFoundError:
            raise _Refused("missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Refused("is a symlink") from None
            raise _Refused(f"cannot open: {exc.strerror}") from None
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("not a regular file")
        if st.st_size > max_bytes:
            raise _Refused(f"larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise _Refused(f"larger than {max_bytes} bytes")
        return data
    finally:
        for fd in reversed(fds):
            os.close(fd)
