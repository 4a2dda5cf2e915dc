"""CLI wall time against the floor: a Python that imports the Temporal client and makes one RPC.

    uv run python bench/cli_latency.py [--runs 10]

One dev server (SQLite WAL), one scripted OpenAI-compatible server and one worker run in
this process; each command runs as a subprocess, as a person would type it, one after
the other so that each round sees the same machine:

* floor: ``python -c`` that imports ``temporalio.client``, connects and makes one RPC
  (``count_workflows``) to the same server;
* ``runllm run examples/summary.rllm`` against that server and worker (the model answers
  at once, so this is the CLI's own cost plus one workflow);
* ``mrp run --help`` (imports and help text only) and ``python -c pass`` for reference;
* two reference clients that run the same ``RllmApp`` workflow on the same app and input
  with nothing of the CLI around it (no checks, no ``typer``, no Keel models): a bare
  one (``temporalio.client`` with its default converter, address and task queue from the
  environment), and the least a Keel client may be, which adds what every Keel client
  must use: ``pydantic_data_converter`` and ``keel.settings.Settings``. They split
  ``runllm run``'s time into the workflow, what Keel's rules cost every client, and the
  CLI's own part (its local checks and their imports).

Prints p50 and p90 of each, its p50 over the floor's, and ends with
``ratio <runllm run p50 / floor p50>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from activities.llm import load_litellm_async  # noqa: E402
from bench.stats import p90  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.settings import Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from tests.support.scripted_openai import (  # noqa: E402
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from workers.main import build_worker  # noqa: E402

ANSWER = '{"summary": "Workers replay history.", "sentences": 1}'
FLOOR = (
    "import asyncio, os, sys\n"
    "from temporalio.client import Client\n"
    "async def main():\n"
    "    client = await Client.connect(sys.argv[1])\n"
    "    await client.count_workflows()\n"
    "asyncio.run(main())\n"
    "os._exit(0)  # sdk-python issue 300: a crash at exit after client use\n"
)
# One RllmApp run of examples/summary.rllm, awaited, by a client with nothing else around
# it. With the argument "keel" it also carries what Keel's rules ask of every client: the
# pydantic converter and Settings (imported only then, so the bare run pays neither).
RLLM_RUN = (
    "import asyncio, os, sys, uuid\n"
    "from temporalio.client import Client\n"
    "async def main():\n"
    "    address, queue, kwargs = os.environ['KEEL_TEMPORAL_ADDRESS'], os.environ['KEEL_TASK_QUEUE'], {}\n"
    "    if sys.argv[1] == 'keel':\n"
    "        from temporalio.contrib.pydantic import pydantic_data_converter\n"
    "        from keel.settings import Settings\n"
    "        s = Settings()\n"
    "        address, queue = s.resolved_temporal_address, s.task_queue\n"
    "        kwargs = {'namespace': s.temporal_namespace, 'data_converter': pydantic_data_converter}\n"
    "    client = await Client.connect(address, **kwargs)\n"
    "    text = open('examples/summary.rllm').read()\n"
    "    inp = {'path': 'summary.rllm', 'files': {'summary.rllm': text}, 'input': 'Workers replay.'}\n"
    "    out = await client.execute_workflow('RllmApp', inp, id=f'rllm/summary/{uuid.uuid4()}', task_queue=queue)\n"
    "    print(out['output'])\n"
    "asyncio.run(main())\n"
    "os._exit(0)\n"
)
FLOOR_NAME = "floor: import temporalio.client + 1 RPC"
RUNLLM_NAME = "runllm run examples/summary.rllm"
BARE_NAME = "bare client, one RllmApp run (reference)"
MINIMUM_NAME = "  the same + pydantic converter + Settings"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    ms = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return ms, proc.stdout


async def main(runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-cli-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        with ScriptedOpenAIServer(default=ScriptedReply(content=ANSWER)) as model:
            cfg = write_models_config(tmp / "models.yaml", model.base_url)
            settings = Settings(
                env="test", data_dir=tmp / "keel", temporal_address=server.address,
                task_queue=f"bench-{uuid.uuid4()}", models_config=cfg,
            )  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
            env.update(
                KEEL_ENV="test", KEEL_TEMPORAL_ADDRESS=server.address,
                KEEL_TASK_QUEUE=settings.task_queue, KEEL_DATA_DIR=str(settings.data_dir),
                KEEL_MODELS_CONFIG=str(cfg),
            )  # fmt: skip
            py = sys.executable
            commands = {
                "python -c pass": [py, "-c", "pass"],
                FLOOR_NAME: [py, "-c", FLOOR, server.address],
                RUNLLM_NAME: [
                    *(py, "-m", "cli.runllm", "run", "examples/summary.rllm"),
                    *("-i", "Workers replay."),
                ],
                "mrp run --help": [py, "-m", "cli.mrp", "run", "--help"],
                BARE_NAME: [py, "-c", RLLM_RUN, "bare"],
                MINIMUM_NAME: [py, "-c", RLLM_RUN, "keel"],
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            client = await connect(settings)
            await load_litellm_async()  # as `keel worker` does before it polls
            async with build_worker(client, settings):
                for i in range(runs + 1):  # the first round warms the page cache
                    for name, argv in commands.items():
                        ms, out = await asyncio.to_thread(timed, argv, env)
                        if name == RUNLLM_NAME:
                            assert json.loads(out)["output"], out
                        elif name in (BARE_NAME, MINIMUM_NAME):
                            assert "summary" in out, out
                        if i:
                            times[name].append(ms)
    finally:
        server.stop()
    print(f"{runs} runs of each command (subprocess wall time), server and worker up, this machine")
    floor = statistics.median(times[FLOOR_NAME])
    print(f"{'command':<44}{'p50 ms':>9}{'p90 ms':>9}{'p50 / floor':>13}")
    for name, values in times.items():
        p50 = statistics.median(values)
        print(f"{name:<44}{p50:>9.1f}{p90(values):>9.1f}{p50 / floor:>12.2f}x")
    runllm = statistics.median(times[RUNLLM_NAME])
    print(
        f"runllm run / the least a Keel client may be: {runllm / statistics.median(times[MINIMUM_NAME]):.2f}"
    )
    print(f"ratio {runllm / floor:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))
