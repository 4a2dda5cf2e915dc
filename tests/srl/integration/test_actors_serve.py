"""``keel actors serve``: dry run, the missing-vLLM error, and the supervision of real child
processes (a stand-in executable takes vLLM's place: vLLM needs a GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.processes import free_port, pid_alive
from tests.support.faults import wait_gone_sync

ROOT = Path(__file__).resolve().parents[3]


def keel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.keel", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_dry_run_prints_the_production_command_lines() -> None:
    out = keel("actors", "serve", "--dry-run", "--vllm", "vllm")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    for gpu, line in enumerate(lines):
        assert line.startswith(f"CUDA_VISIBLE_DEVICES={gpu} vllm serve Qwen/Qwen3-14B ")
        assert f"--host 127.0.0.1 --port {8001 + gpu} --tensor-parallel-size 1" in line
        assert "--quantization bitsandbytes" in line


def test_without_vllm_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    # PATH without vllm; the test interpreter's venv has none either.
    assert not (Path(sys.executable).parent / "vllm").exists()
    out = keel("actors", "serve", env={"PATH": "/usr/bin:/bin", "KEEL_DATA_DIR": str(tmp_path)})
    assert out.returncode == 1
    assert "vLLM is not installed" in out.stderr and "uv pip install vllm" in out.stderr
    assert not (tmp_path / "logs" / "actors").exists()


def test_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "actors.yaml"
    cfg.write_text("endpoints: []\n")
    out = keel("actors", "serve", "--config", str(cfg), "--dry-run")
    assert out.returncode == 2
    assert f"{cfg}: invalid actors config: endpoints" in out.stderr


def test_serve_starts_restarts_and_stops_children_by_pid(tmp_path: Path) -> None:
    fake = tmp_path / "vllm"
    # Writes what it was started with, then waits like a server would; on SIGTERM it
    # says so with its pid before it exits (a SIGTERM blocked in it would never say so).
    fake.write_text(
        '#!/bin/sh\necho "gpu=$CUDA_VISIBLE_DEVICES args=$*"\n'
        "trap 'echo \"TERM $$\"; exit 0' TERM\n"
        "sleep 300 &\nwait\n"
    )
    fake.chmod(0o755)
    ports = [free_port(), free_port()]
    cfg = tmp_path / "actors.yaml"
    cfg.write_text(
        "endpoints:\n"
        + "".join(
            f"  - {{name: g{i}, base_url: 'http://127.0.0.1:{p}/v1', port: {p}, gpu: {i}, "
            f"model: m/x, quantization: awq}}\n"
            for i, p in enumerate(ports)
        )
    )
    argv = [sys.executable, "-m", "cli.keel", "actors", "serve", "--config", str(cfg)]
    proc = subprocess.Popen(
        [*argv, "--vllm", str(fake)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KEEL_DATA_DIR": str(tmp_path / "data")},
        start_new_session=True,
    )
    pids: dict[str, int] = {}
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if line.startswith("Stop with Ctrl-C"):
                break
            name, _, pid_text, *_ = line.split()
            pids[name] = int(pid_text)
        assert sorted(pids) == ["g0", "g1"]
        assert all(pid_alive(p) for p in pids.values())
        logs = tmp_path / "data" / "logs" / "actors"
        deadline = time.monotonic() + 10
        while not all(
            (logs / f"{n}.log").exists() and (logs / f"{n}.log").read_text() for n in pids
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (logs / "g1.log").read_text().splitlines()[0] == (
            f"gpu=1 args=serve m/x --host 127.0.0.1 --port {ports[1]} "
            "--tensor-parallel-size 1 --quantization awq"
        )

        os.killpg(pids["g0"], signal.SIGKILL)  # an actor dies: restarted after 1 s
        deadline = time.monotonic() + 15
        while (logs / "g0.log").read_text().count("gpu=0") < 2:
            assert time.monotonic() < deadline, "g0 was not restarted"
            time.sleep(0.1)

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        assert "g0 (pid" in err and "g0 restarted (pid" in err
        restarted = int(err.split("g0 restarted (pid ")[1].split(")")[0])
        # SIGTERM reached every running actor and was not blocked in it: each one ran its
        # TERM trap (rather than being SIGKILLed after the 10 s grace, which runs none).
        assert f"TERM {pids['g1']}" in (logs / "g1.log").read_text().splitlines()
        g0_lines = (logs / "g0.log").read_text().splitlines()
        assert f"TERM {restarted}" in g0_lines
        assert f"TERM {pids['g0']}" not in g0_lines  # the first g0 was SIGKILLed above
        wait_gone_sync([*pids.values(), restarted], what="every actor to be gone")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in pids.values():
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
