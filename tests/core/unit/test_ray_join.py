"""KEEL_RAY_ADDRESS: how a worker joins a Ray cluster you already run, checked without
starting Ray (the two-node run is tests/mrp/integration/test_ray_cluster.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from activities import fanout
from keel.settings import Settings
from services.processes import LOOPBACK, free_port


def test_ray_address_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEEL_RAY_ADDRESS", raising=False)
    assert Settings(_env_file=None).ray_address is None  # type: ignore[call-arg]
    monkeypatch.setenv("KEEL_RAY_ADDRESS", "10.0.0.5:6379")
    assert Settings(_env_file=None).ray_address == "10.0.0.5:6379"  # type: ignore[call-arg]
    assert fanout.configured_address() == "10.0.0.5:6379"
    monkeypatch.setenv("KEEL_RAY_ADDRESS", "  ")  # compose without the ray profile
    assert Settings(_env_file=None).ray_address is None  # type: ignore[call-arg]


def test_a_loopback_address_is_a_cluster_on_this_host() -> None:
    # Joined in Ray's loopback mode, so Ray does not rewrite 127.0.0.1 to the host's IP.
    for address in ("127.0.0.1:6379", "localhost:6379", "[::1]:6379", "ray://127.0.0.1:10001"):
        assert fanout.on_loopback(address), address
    for address in ("ray-head:6379", "10.0.0.5:6379", "ray://10.0.0.5:10001", "auto"):
        assert not fanout.on_loopback(address), address


def test_an_address_where_nothing_listens_is_named_unreachable() -> None:
    with socket.socket() as listening:
        listening.bind((LOOPBACK, free_port()))
        listening.listen()
        port = listening.getsockname()[1]
        assert fanout.gcs_unreachable(f"127.0.0.1:{port}") is None
        assert fanout.gcs_unreachable(f"ray://127.0.0.1:{port}") is None
    assert fanout.gcs_unreachable(f"127.0.0.1:{port}") == "Connection refused"
    assert fanout.gcs_unreachable("auto") is None  # Ray finds that one itself


def test_a_worker_pointed_where_no_cluster_runs_fails_at_once_saying_so() -> None:
    """Ray's own ``ray.init`` retries an address with nothing behind it for minutes
    (seen: still retrying after 120 s); Keel fails the join at once with the address."""
    address = f"127.0.0.1:{free_port()}"
    code = (
        "from activities import fanout\n"
        "try:\n"
        f"    fanout.ray_init(1, address={address!r})\n"
        "except fanout.RayUnreachable as exc:\n"
        "    import ray; print(ray.is_initialized(), exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=fanout.REPO_ROOT, capture_output=True, text=True,
        timeout=120,  # Ray alone would still be retrying there
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"False no Ray cluster answers at KEEL_RAY_ADDRESS={address} (Connection refused): "
        "start it, fix the address, or unset KEEL_RAY_ADDRESS for a local Ray"
    )


def test_join_arguments_ship_the_code_through_ray() -> None:
    args = fanout.join_arguments("ray-head:6379")
    assert args["address"] == "ray-head:6379" and args["namespace"] == "keel"
    # Nothing that would start a cluster of our own, and no path a remote node lacks.
    assert not {"num_cpus", "_temp_dir", "include_dashboard"} & set(args)
    env = args["runtime_env"]
    assert "PYTHONPATH" not in env["env_vars"]
    root = Path(env["working_dir"])
    assert root == fanout.REPO_ROOT
    excludes = set(env["excludes"])
    assert {".venv", ".git", "__pycache__", "*.pyc"} <= excludes
    # What a shard imports is inside the shipped working_dir: our packages, the shipped
    # operators, the configs the settings name, and the test operators.
    shipped = [p for p in root.iterdir() if p.name not in excludes]
    names = {p.name for p in shipped}
    for pkg in ("keel", "activities", "operators", "store", "sandbox", "configs", "tests"):
        assert pkg in names and (root / pkg).is_dir()
    # Under Ray's working_dir size cap (tracked files only; ignored ones are not shipped).
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")
    size = sum(
        (root / f.decode()).stat().st_size
        for f in tracked
        if f and (root / f.decode()).is_file() and f.split(b"/")[0].decode() not in excludes
    )
    assert size < 100 * 1024 * 1024


def test_local_path_maps_operator_folders_to_the_shipped_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = str(fanout.REPO_ROOT / "operators" / "numeric_sum")
    monkeypatch.delenv(fanout.DRIVER_ROOT_ENV, raising=False)
    assert fanout.local_path(folder) == folder  # local Ray: unchanged
    driver = tmp_path / "driver-repo"
    monkeypatch.setenv(fanout.DRIVER_ROOT_ENV, str(driver))
    assert fanout.local_path(str(driver / "operators" / "x")) == str(
        fanout.REPO_ROOT / "operators" / "x"
    )
    assert fanout.local_path("/elsewhere/op") == "/elsewhere/op"  # outside the repository


def test_joined_cluster_is_only_disconnected(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray_shutdown on a joined cluster calls ray.shutdown (disconnect) and reaps nothing."""
    import ray

    calls: list[str] = []
    reaped: list[set[int]] = []
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(fanout, "_reap", lambda pids, timeout_s=5.0: reaped.append(pids))
    monkeypatch.setitem(fanout._ray_state, "joined", True)
    monkeypatch.setitem(fanout._ray_state, "owned", False)
    fanout.ray_shutdown()
    assert calls == ["shutdown"] and reaped == [] and not fanout._ray_state["joined"]
