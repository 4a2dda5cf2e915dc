"""SRL throughput: steps per minute with 1, 2 and 3 actors, and the jail's cost on one
ast-grep action.

    uv run python bench/srl_throughput.py [--tasks 12] [--actors 1,2,3] [--rounds 20]

1. Sandbox: each task of examples/srl/tasks.jsonl has its gold action applied ``--rounds``
   times, interleaved: bare ``ast-grep run --update-all`` on a temp copy of the file (no
   jail), and ``sandbox.apply_astgrep_async`` (a fresh nsjail each time: workspace copied
   in, rewritten, read back, diffed). Prints p50 of each and ``ratio sandbox/bare``.
2. Actors: one dev server, one worker and ``--actors`` llama.cpp servers with the
   embedded model (one thread each) run here. For n = 1, 2, 3 a fresh ``SRLCollection``
   of ``--tasks`` tasks (the example tasks repeated) runs in actor mode against the first
   n servers, window 2n, one step per episode; its steps per minute are timed from start
   to result. Prints each and its ratio to 1 actor. The machine's cores bound this: with
   fewer cores than actors, the servers share them.

Every server it starts binds loopback and is stopped by its PID before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.srl import start_collection, upload_tasks  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.settings import Settings  # noqa: E402
from keel.srl.steps import CollectionInput, SrlTask, parse_tasks  # noqa: E402
from sandbox import AstGrepAction  # noqa: E402
from sandbox.astgrep import apply_astgrep_async, astgrep_binary  # noqa: E402
from services.model_server import LocalModelServer  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from store.artifacts import artifact_store_from_settings  # noqa: E402
from workers.main import build_worker  # noqa: E402

TASKS = ROOT / "examples" / "srl" / "tasks.jsonl"


def bare_astgrep(task: SrlTask, workdir: Path) -> float:
    """Seconds for ``ast-grep run --update-all`` on a copy of the task's file, no jail."""
    path = workdir / task.file_name
    path.write_text(task.pre)
    g = task.gold_action
    if g is None:
        raise SystemExit(f"{task.task_id} has no gold action to time")
    argv = [astgrep_binary(), "run", "--pattern", g.pattern, "--rewrite", g.rewrite]
    argv += ["--lang", g.language, "--update-all", str(path)]
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if path.read_text() != task.post:
        raise SystemExit(f"bare ast-grep did not reproduce {task.task_id}")
    return elapsed


async def jailed_astgrep(task: SrlTask) -> float:
    g = task.gold_action
    if g is None:
        raise SystemExit(f"{task.task_id} has no gold action to time")
    started = time.perf_counter()
    r = await apply_astgrep_async(
        AstGrepAction(pattern=g.pattern, rewrite=g.rewrite, language=g.language),
        {task.file_name: task.pre},
    )
    elapsed = time.perf_counter() - started
    if r.changed_files.get(task.file_name) != task.post:
        raise SystemExit(f"the jailed ast-grep did not reproduce {task.task_id}: {r.error}")
    return elapsed


async def sandbox_part(tasks: list[SrlTask], rounds: int) -> None:
    bare: list[float] = []
    jailed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="keel-bench-sg-") as tmp:
        for _ in range(rounds):
            for task in tasks:
                bare.append(bare_astgrep(task, Path(tmp)))
                jailed.append(await jailed_astgrep(task))
    b, j = statistics.median(bare), statistics.median(jailed)
    print(
        f"sandbox: {len(bare)} actions each; bare ast-grep p50 {b * 1000:.1f} ms, "
        f"jailed p50 {j * 1000:.1f} ms"
    )
    print(f"ratio sandbox/bare {j / b:.2f}")


def actors_yaml(servers: list[LocalModelServer]) -> str:
    return "endpoints:\n" + "".join(
        f"  - {{name: a{i}, base_url: '{s.base_url}', port: {s.port}, model: smollm2}}\n"
        for i, s in enumerate(servers)
    )


async def actors_part(n_tasks: int, counts: list[int], tmp: Path) -> None:
    base = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    tasks = [
        {**base[i % len(base)], "task_id": f"{base[i % len(base)]['task_id']}-{i}"}
        for i in range(n_tasks)
    ]
    data = "".join(json.dumps(t) + "\n" for t in tasks).encode()
    server = TemporalDevServer(
        db_file=tmp / "temporal.db", log_path=tmp / "temporal.log", port=free_port(), ui_port=None
    )
    server.start()
    models: list[LocalModelServer] = []
    try:
        for i in range(max(counts)):
            m = LocalModelServer(port=free_port(), threads=1, ctx=2048, log_path=tmp / f"m{i}.log")
            m.start(timeout_s=300)
            models.append(m)
        rates: dict[int, float] = {}
        for n in counts:
            config = tmp / f"actors-{n}.yaml"
            config.write_text(actors_yaml(models[:n]))
            settings = Settings(
                env="test",
                data_dir=tmp / f"keel-{n}",
                temporal_address=server.address,
                task_queue=f"bench-srl-{uuid.uuid4().hex[:8]}",
                metrics_port=0,
                srl_actors_config=config,
            )
            digest, count = upload_tasks(artifact_store_from_settings(settings), data)
            client = await connect(settings)
            inp = CollectionInput(
                collection=f"bench-{n}",
                tasks_digest=digest,
                task_count=count,
                source="actor",
                model="smollm2",
                window=2 * n,
                max_steps=1,
                max_tokens=96,
            )
            async with build_worker(client, settings):
                started = time.perf_counter()
                handle = await start_collection(client, inp, task_queue=settings.task_queue)
                result = await handle.result()
                elapsed = time.perf_counter() - started
            steps = result.totals.steps
            rates[n] = steps / (elapsed / 60)
            print(
                f"actors {n}: {steps} steps in {elapsed:.1f} s = {rates[n]:.1f} steps/min "
                f"({result.totals.verified_steps} verified, {result.totals.format_errors} "
                f"malformed); ratio to 1 actor {rates[n] / rates[counts[0]]:.2f}"
            )
    finally:
        for m in models:
            m.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--actors", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--skip-actors", action="store_true")
    args = parser.parse_args()
    tasks = parse_tasks(TASKS.read_bytes())
    print(
        f"machine: {os.cpu_count()} cores; ast-grep {shutil.which('ast-grep') or astgrep_binary()}"
    )
    asyncio.run(sandbox_part(tasks, args.rounds))
    if not args.skip_actors:
        counts = [int(x) for x in args.actors.split(",")]
        with tempfile.TemporaryDirectory(prefix="keel-bench-srl-") as tmp:
            asyncio.run(actors_part(args.tasks, counts, Path(tmp)))


if __name__ == "__main__":
    main()
