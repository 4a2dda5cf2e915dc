"""Operators load and run inside Ray worker processes (local Ray on loopback).

Workers get an ``OperatorHandle`` (spec + folder, plain JSON) and import the operator from
its folder by path: no runtime env and no sys.path entry for operator code is needed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from activities import fanout
from activities.mrp.operators import OperatorHandle, invoke_map, load_mrp_config
from keel.mrp.sdk import OperatorContext, OperatorError
from tests.support.mrp_operators import TEST_CONFIG
from tests.support.mrp_operators.flaky.agent import attempts

ray = pytest.importorskip("ray")


def run_shard(handle_json: str, items: list, params: dict, shard: str) -> dict:
    handle = OperatorHandle.model_validate_json(handle_json)
    instance = handle.load()
    ctx = OperatorContext(params=params, seed=3, shard_id=shard, operator=handle.spec.ref)
    try:
        out = invoke_map(handle.spec, instance, items, ctx)
    except OperatorError as e:
        return {"pid": os.getpid(), "error": str(e), "retryable": e.retryable}
    return {"pid": os.getpid(), "output": out, "module": type(instance).__module__}


@pytest.mark.full_tier
def test_test_operators_run_in_ray_workers(tmp_path: Path):
    cfg = load_mrp_config(path=TEST_CONFIG)
    flaky = cfg.handle("flaky@1.0.0").model_dump_json()
    word_count = cfg.handle("word-count@1.0.0").model_dump_json()
    state = tmp_path / "attempts"
    # Ray's socket paths must stay under 108 bytes: pytest's tmp_path is too deep.
    ray_dir = tempfile.mkdtemp(prefix="keel-m1-ray-", dir="/tmp")
    fanout.ray_shutdown()  # a Ray another module of this process may have left up
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=ray_dir,
    )
    try:
        task = ray.remote(max_retries=0)(run_shard)
        params = {"state_dir": str(state), "fail_times": 1}
        first = ray.get(task.remote(flaky, ["ab"], params, "shard-000000"), timeout=120)
        assert "planned failure 1 of 1" in first["error"] and first["retryable"]
        second = ray.get(task.remote(flaky, ["ab"], params, "shard-000000"), timeout=120)
        assert second["output"] == {"items": 1, "chars": 2}
        assert second["pid"] != os.getpid()
        assert second["module"].startswith("keel_mrp_operators.flaky_1_0_0_")
        assert attempts(state, "shard-000000") == 2
        wc = ray.get(task.remote(word_count, ["a b c"], {}, "shard-000001"), timeout=120)
        assert wc["output"] == {"items": 1, "words": 3, "chars": 5}
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
