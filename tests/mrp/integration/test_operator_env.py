"""Operators cannot read the worker's secrets, on the threads and the Ray backend.

The worker (this test process, and the Ray cluster it starts) holds
``OPENAI_API_KEY=sk-test-secret``. The ``env-probe`` test operator looks for it in
``os.environ``, ``os.getenv`` and ``/proc/self/environ``, and checks that the one variable
its ``operator.yaml`` declares (``env: [KEEL_PROBE_DECLARED]``) is there; the counts go
through the real job (map on each backend, numeric-sum reduce, json-writer produce), so
the test reads what a user of the job would read: the produced file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.mrp.host import stop_hosts
from keel.mrp.run import MRPJobInput
from keel.settings import Settings
from tests.support.mrp_jobs import run_job
from workers.main import build_worker

SECRET = "sk-test-secret"
DECLARED_VALUE = "probe-ok"

pytestmark = pytest.mark.usefixtures("ray_for_module")


def job(job_id: str) -> str:
    params = {
        "secret": SECRET,
        "name": "OPENAI_API_KEY",
        "declared": "KEEL_PROBE_DECLARED",
        "declared_value": DECLARED_VALUE,
        "worker_pid": os.getpid(),
    }
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: [1, 2, 3, 4]
  by: item
map:
  operator: env-probe@1.0.0
  params: {json.dumps(params)}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: probe.json}}
policy:
  max_workers: 2
  budget_units: "100"
"""


@pytest.mark.parametrize("backend", ["threads", "ray"])
async def test_operators_cannot_read_a_key_the_worker_holds(
    client: Client,
    mrp_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    from activities.fanout import ray_shutdown

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("KEEL_PROBE_DECLARED", DECLARED_VALUE)
    # Hosts and Ray workers start from now on, with the secret in the worker's environment.
    stop_hosts()
    ray_shutdown()
    assert os.environ["OPENAI_API_KEY"] == SECRET
    async with build_worker(client, mrp_settings):
        result = await run_job(
            client,
            mrp_settings,
            f"env-probe-{backend}",
            MRPJobInput(job_yaml=job(f"env-probe-{backend}"), backend=backend),  # type: ignore[arg-type]
        )
    stop_hosts()
    assert result.status == "succeeded", result
    totals = json.loads((Path(result.output_root or "") / "probe.json").read_text())["data"][
        "totals"
    ]
    assert totals["shards"] == "4"
    # Not in os.environ, not through getenv, not in the process's own environment block.
    assert totals["secret_in_environ"] == "0"
    assert totals["secret_in_getenv"] == "0"
    assert totals["secret_in_proc_self_environ"] == "0"
    # What operator.yaml declares is there, in os.environ and in ctx.env, and nothing else.
    assert totals["declared_seen"] == "4" and totals["declared_in_ctx_env"] == "4"
    assert totals["undeclared_names"] == "0"
    assert totals["proc_names"] == "4"  # one variable per shard: the declared one
    # And the operator did not run in the worker's process.
    assert totals["pid_is_worker"] == "0"


def test_control_the_probe_sees_the_key_when_run_in_the_worker_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe is not blind: called in this process (as the threads backend, reduce and
    produce did before operator hosts), it finds the key."""
    from activities.mrp.operators import invoke_map, load_mrp_config
    from keel.mrp.sdk import OperatorContext
    from tests.support.mrp_operators import TEST_CONFIG

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    config = load_mrp_config(path=TEST_CONFIG)
    handle = config.handle("env-probe@1.0.0")
    params = json.loads(job("x").split("params: ", 1)[1].split("\n", 1)[0])
    out = invoke_map(handle.spec, handle.load(), [1], OperatorContext(params=params))
    assert isinstance(out, dict)
    assert out["secret_in_environ"] == 1 and out["secret_in_getenv"] == 1
    assert out["pid_is_worker"] == 1
