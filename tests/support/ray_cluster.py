"""A real two-node Ray cluster on loopback for tests: ``ray start --head`` and a second
``ray start --address=...`` node, each ``--block``-ed in its own process group, stopped by
its own process group (never ``ray stop``, which would stop every Ray of this host)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.faults import descendants, running, wait_gone_sync

RAY_CLI = Path(sys.executable).parent / "ray"
# A loopback test cluster: no token auth (``ray start --head`` turns it on by default;
# the joining process must then carry RAY_AUTH_TOKEN, see docs/deploy.md).
# Multi-node needs Ray's cluster mode (activities.fanout turns it off for its private Ray).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

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
        """SIGTERM the group (Ray's own clean stop), then SIGKILL what is left; wait."""
        if self.proc.poll() is not None and not any(running(p) for p in self.tree()):
            return
        tree = self.tree()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(running(p) for p in tree):
            time.sleep(0.1)
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


def _start(name: str, args: list[str], temp_root: Path) -> RayNode:
    log = temp_root / f"{name}.log"
    env = dict(os.environ) | RAY_ENV
    env.pop("KEEL_RAY_ADDRESS", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(RAY_CLI), "start", "--block", "--disable-usage-stats", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopped by killpg
        )
    return RayNode(name, proc, log)


def start_cluster(timeout_s: float = 120.0) -> RayCluster:
    """Head (``{"head": 1}``, 1 CPU) and a second node (``{"second": 1}``, 1 CPU)."""
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
                *common,
                '--resources={"head": 1}',
                f"--temp-dir={temp_root}/h",
            ],
            temp_root,
        )
        _wait_nodes(cluster, 1, timeout_s)
        cluster.nodes["second"] = _start(
            "second",
            [
                f"--address={cluster.address}",
                *common,
                '--resources={"second": 1}',
                f"--temp-dir={temp_root}/s",
            ],
            temp_root,
        )
        _wait_nodes(cluster, 2, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_nodes(cluster: RayCluster, n: int, timeout_s: float) -> None:
    """Until ``ray status`` on the cluster lists ``n`` alive nodes."""
    deadline = time.monotonic() + timeout_s
    out = ""
    while time.monotonic() < deadline:
        for node in cluster.nodes.values():
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray node {node.name} exited:\n{node.log.read_text()}")
        res = subprocess.run(
            [str(RAY_CLI), "status", f"--address={cluster.address}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out = res.stdout + res.stderr
        active = out.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in out else ""
        if active.count("node_") >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray cluster did not reach {n} nodes:\n{out}")
