"""A real two-node Ray cluster on loopback for tests: ``ray start --head`` and a second
``ray start --address=...`` node, each ``--block``-ed in its own process group, stopped by
its own process group (never ``ray stop``, which would stop every Ray of this host).

Every server of both nodes listens on 127.0.0.1 only: the nodes run in Ray's loopback mode
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). Both start through
:mod:`tests.support.ray_loopback_node`: ``ray start`` refuses a second node in that mode,
and gives a node a fixed 30 s to register, which a loaded 2-core host can miss.
:func:`listening` lists what a set of processes listens on, so a test can check."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.processes import free_port  # below the kernel's ephemeral range: see there
from tests.support.faults import descendants, wait_gone_sync

# A loopback test cluster: no token auth (``ray start --head`` turns it on by default;
# the joining process must then carry RAY_AUTH_TOKEN, see docs/deploy.md), and Ray's
# loopback mode, in which every server binds 127.0.0.1.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # How long a raylet waits for its runtime-env agent to answer before it exits (30 s
    # by default; Keel's own local Ray gives 120 s, activities/fanout.py): longer here,
    # where the whole suite runs beside the nodes (see agent_ports).
    "RAY_agent_register_timeout_ms": "300000",
}


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    temp_dir: Path  # its ``--temp-dir``: Ray's session and logs

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> set[int]:
        return descendants(self.pid) | {self.pid}

    def kill(self) -> set[int]:
        """SIGKILL the node's whole process group (raylet, its workers, the CLI)."""
        tree = self.tree()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in tree:  # anything that left the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return tree

    def stop(self) -> None:
        """SIGKILL the node's process group and wait until every process of it is gone
        (a test cluster keeps nothing worth a clean stop, and Ray's own SIGTERM path
        took 10 s here)."""
        tree = self.tree()
        self.kill()
        wait_gone_sync(tree, what=f"Ray node {self.name} to exit")


@dataclass
class RayCluster:
    address: str
    temp_root: Path
    nodes: dict[str, RayNode] = field(default_factory=dict)

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.stop()
        shutil.rmtree(self.temp_root, ignore_errors=True)


#: An executable to start each test node with in place of the launcher
#: (:mod:`tests.support.ray_loopback_node`), given ``ray start``'s arguments: a test of
#: the cluster fixture puts a ``ray`` there that fails.
RAY_COMMAND_ENV = "KEEL_TEST_RAY"


def ray_command() -> list[str]:
    """What starts a node: ``$KEEL_TEST_RAY`` if set, else the loopback launcher in this
    interpreter (the venv's Ray)."""
    override = os.environ.get(RAY_COMMAND_ENV)
    if override:
        return [override]
    return [sys.executable, "-m", "tests.support.ray_loopback_node"]


def _start(
    name: str, args: list[str], temp_root: Path, temp_dir: str, *, joins: bool = False
) -> RayNode:
    log = temp_root / f"{name}.log"
    env = dict(os.environ) | RAY_ENV
    env.pop("KEEL_RAY_ADDRESS", None)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [repo, env.get("PYTHONPATH", "")] if p)
    if joins:
        env["KEEL_TEST_RAY_JOINS"] = "1"
    for arg in args:  # the launcher hands the agent's listen port to the raylet too
        if arg.startswith("--dashboard-agent-listen-port="):
            env["KEEL_TEST_RAY_AGENT_LISTEN_PORT"] = arg.partition("=")[2]
    ray = ray_command()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *ray,
                "start",
                "--block",
                "--disable-usage-stats",
                *args,
                f"--temp-dir={temp_root / temp_dir}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopped by killpg
        )
    return RayNode(name, proc, log, temp_root / temp_dir)


# Ray gives a starting node 30 s (not configurable) to register with the GCS; on a
# 2-core machine running the rest of the suite beside it, the head missed that (clean
# clone 20, then CI, 2026-11-28). The launcher waits longer
# (tests.support.ray_loopback_node). CI then saw the joining node's raylet crash at its
# start on both tries (2026-11-28 12:01; the cause: agent_ports). A start that fails in
# any way is tried again with a fresh temp dir and ports, and a node whose raylet died
# is given up at once, with Ray's own fatal lines, instead of waiting out ``timeout_s``.


class ClusterStartFailed(RuntimeError):
    """Ray could not bring the two nodes up (its own processes failed or were too slow),
    in every attempt: the message holds each attempt's error and Ray's fatal lines."""


def start_cluster(timeout_s: float = 150.0, attempts: int = 3) -> RayCluster:
    """Head (``{"head": 1}``, 1 CPU) and a second node (``{"second": 1}``, 1 CPU), each
    given ``timeout_s`` to come up; a start that fails is tried again, up to ``attempts``
    in all. :class:`ClusterStartFailed` if none came up."""
    errors: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            return _start_cluster(timeout_s)
        except (NodeExited, TimeoutError) as err:
            first = str(err).splitlines()[0]
            fatal = [n for n in getattr(err, "__notes__", []) if n.startswith("FATAL")]
            errors.append("\n".join([f"attempt {attempt}: {first}", *fatal]))
            print(f"ray cluster attempt {attempt} failed: {err}", file=sys.stderr)
            for note in getattr(err, "__notes__", []):
                print(note, file=sys.stderr)
    raise ClusterStartFailed("\n".join(errors))


@contextlib.contextmanager
def running_cluster() -> Iterator[RayCluster]:
    """A started cluster, stopped at the end (the body of the ``ray_cluster`` fixture).
    A cluster that does not come up fails the test (an error in its setup) with each
    attempt's error and Ray's fatal lines: never a skip, since CI has Ray and a test
    that never ran is not a pass."""
    try:
        cluster = start_cluster()
    except ClusterStartFailed as err:
        # Ray's own processes (a raylet or the GCS) crashed or did not come up, in every
        # try: nothing of Keel has run yet. The full logs are in the captured stderr.
        raise pytest.fail.Exception(
            f"Ray could not start the two-node test cluster on this host:\n{err}",
            pytrace=False,
        ) from None  # the message has all of it: no chained traceback
    try:
        yield cluster
    finally:
        cluster.stop()


class NodeExited(RuntimeError):
    def __init__(self, node: RayNode, why: str = "exited") -> None:
        self.log = node.log.read_text(errors="replace") if node.log.exists() else ""
        super().__init__(f"ray node {node.name} {why}:\n{self.log[-3000:]}")


def agent_ports() -> list[str]:
    """A node's agent ports, each given (free on this host), none left to Ray.

    Left to Ray, an agent binds port 0 and writes the port it got to a file, and the
    raylet waits for that file a fixed 15 to 30 s (Ray 2.60), then dies of a failed check
    ("Timed out waiting for file .../metrics_agent_port_..."). On CI's 2-core machine with
    the suite beside it, the agents' Python start took longer: CI crashed the joining
    node's raylet that way on both tries (2026-11-28 12:01), and a start with the agents
    held 40 s (a ``sitecustomize`` sleep) crashed the head the same way here. Given the
    ports, the raylet reads none of those files (``ray start`` does not pass the listen
    port on to the raylet: :mod:`tests.support.ray_loopback_node` does). A fixed default
    (the agent's 52365) could also be held by another Ray of this host."""
    return [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",  # the metrics agent's
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]


def _start_cluster(timeout_s: float) -> RayCluster:
    temp_root = Path(tempfile.mkdtemp(prefix=f"kr{uuid.uuid4().hex[:4]}-", dir="/tmp"))
    port = free_port()
    cluster = RayCluster(f"127.0.0.1:{port}", temp_root)
    try:
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=1"]
        cluster.nodes["head"] = _start(
            "head",
            [
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                *agent_ports(),
                *common,
                '--resources={"head": 1}',
            ],
            temp_root,
            "h",
        )
        _wait_started(cluster.nodes["head"], timeout_s)
        cluster.nodes["second"] = _start(
            "second",
            [
                f"--address={cluster.address}",
                *agent_ports(),
                *common,
                '--resources={"second": 1}',
            ],
            temp_root,
            "s",
            joins=True,
        )
        _wait_started(cluster.nodes["second"], timeout_s)
    except (NodeExited, TimeoutError) as err:
        for note in _session_logs(temp_root):
            err.add_note(note)
        cluster.stop()
        raise
    except BaseException:
        cluster.stop()
        raise
    return cluster


#: What ``ray start --block`` prints once its node is up: registered with the GCS (the
#: head's own, or the cluster's), its address written, every process of it started.
STARTED = "This command will now block forever"


def _wait_started(node: RayNode, timeout_s: float) -> None:
    """Until ``node``'s ``ray start`` says it is up, read from its log: nothing is asked of
    the cluster meanwhile (a ``ray status`` a second, which an earlier version polled,
    cost 2.5 s of CPU each on a host where the node was already short of it). A node whose
    raylet or GCS logged a fatal error is given up at once: ``ray start`` would wait for it
    to register until its own timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise NodeExited(node)
        if node.log.exists() and STARTED in node.log.read_text(errors="replace"):
            return
        if _fatal_lines(node.temp_dir):
            raise NodeExited(node, "crashed (its raylet or GCS logged a fatal error)")
        time.sleep(0.2)
    raise TimeoutError(f"ray node {node.name} was not up in {timeout_s:.0f} s")


#: A fatal line of Ray's C++ logs (level ``C``: a failed check or a fatal exit), or the
#: start of the stack trace a crash prints.
FATAL = re.compile(r"^\[[^\]]* C \d+ \d+\]|^\*\*\* (SIG\w+|StackTrace|Check failure)", re.M)
PROCESS_LOGS = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err")


def _fatal_lines(temp_dir: Path) -> list[str]:
    """Each fatal line of the raylet's and GCS's logs under ``temp_dir`` (one node's),
    with the name of its log."""
    found = []
    for name in PROCESS_LOGS:
        for path in temp_dir.glob(f"session_latest/logs/{name}"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                found += [
                    f"{name}: {text[m.start() :].split(chr(10), 1)[0]}"
                    for m in FATAL.finditer(text)
                ]
    return found


def _session_logs(temp_root: Path, tail_bytes: int = 2000) -> list[str]:
    """What a start that failed left, read before the temp dir goes: first every fatal
    line of each node's raylet and GCS (a crash's cause, which a tail would cut off
    behind its stack trace), then the end of each node's ``ray start`` output and of
    Ray's own process logs."""
    parts = []
    for node_dir in sorted(p for p in temp_root.iterdir() if p.is_dir()):
        for line in _fatal_lines(node_dir):
            parts.append(f"FATAL {node_dir.name}/{line}")
    paths = sorted(temp_root.glob("*.log"))
    for name in (*PROCESS_LOGS, "dashboard_agent.log", "runtime_env_agent.log"):
        paths += sorted(temp_root.glob(f"*/session_latest/logs/{name}"))
    for path in paths:
        with contextlib.suppress(OSError):
            text = path.read_bytes()[-tail_bytes:].decode(errors="replace")
            parts.append(f"--- {path.relative_to(temp_root)}\n{text}")
    return parts


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket that one of ``pids`` listens on, read from
    /proc (``/proc/net/tcp{,6}`` for listening sockets, ``/proc/<pid>/fd`` for owners)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found: set[tuple[str, int]] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                host, port = cols[1].split(":")
                raw = bytes.fromhex(host)
                # /proc prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(words)
                found.add((str(ip), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
