"""``design show`` and ``GET /design/decision-sets/{id}`` on a real run with a repair round
(issue 38 §5): a scripted codegen model writes a broken handler, the validators fail, the
model's repair makes them pass. Both entry points read the same use cases
(``client/design_cases.py``, ``client/design_view.py``): the repair round (its number, the
findings, the files it changed) and which provider and model answered each node, the
rules or a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from api.app import create_app
from client import design_cases as cases
from keel.design.steps import DesignOptions, DesignResult
from keel.settings import Settings
from store.db import get_sessionmaker
from tests.design.integration.test_repair import BROKEN, HANDLER
from tests.design.unit.design_data import golden_cases
from tests.support.api import asgi_client, auth, with_tokens
from tests.support.design_repo import MODEL_FILES
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

REPO = Path(__file__).resolve().parents[3]


def design_show(settings: Settings, project: str, *mode: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KEEL_DATA_DIR": str(settings.data_dir),
        "KEEL_TEMPORAL_ADDRESS": settings.temporal_address,
        "KEEL_USER": "alice",
        "KEEL_METRICS_PORT": "0",
    }
    return subprocess.run(
        [sys.executable, "-m", "cli.design", "show", project, "ds1", *mode],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def by_node(nodes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {n["node"]: n["answered_by"] for n in nodes}


async def test_show_prints_the_repair_round_and_the_model_of_each_node(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    replies = [
        ScriptedReply(content=json.dumps({"files": BROKEN})),
        ScriptedReply(content=json.dumps({"files": {HANDLER: MODEL_FILES[HANDLER]}})),
    ]
    project = f"p-{uuid.uuid4().hex[:8]}"
    sm = get_sessionmaker(settings.resolved_database_url)
    assert cases.create_project(sm, project, owner="alice", name="")
    options = DesignOptions(
        intake=golden_cases()["batch_training"]["constraints"],
        require_approval=False,
        codegen="litellm",
        codegen_model="local",
    )
    with ScriptedOpenAIServer(replies) as llm:
        settings.models_config = write_models_config(tmp_path / "models.yaml", llm.base_url)
        inp = cases.new_decision_set(
            sm, settings, project, options, requester="alice", decision_set="ds1"
        )
        async with build_worker(client, settings):
            handle = await cases.start(client, inp, task_queue=settings.task_queue)
            result: DesignResult = await handle.result()
    assert result.status == "completed" and [r.round for r in result.repairs] == [1]

    shown = design_show(settings, project, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    (round1,) = view["repairs"]
    assert round1["round"] == 1 and "pytest" in round1["failed"], round1
    assert round1["files_changed"] == [HANDLER]
    assert round1["findings"] >= 1 and round1["fixed"] >= 1, round1
    assert "failed" not in round1["validation"].values()
    nodes = by_node(view["nodes"])
    assert nodes["codegen"] == [
        {"provider": "litellm", "model": "local", "answered_by": "local", "runs": 1}
    ]
    (repair,) = nodes["repair"]
    assert repair["provider"] == "litellm" and repair["answered_by"] != "rules", repair
    # The guided form needs no model: the intake and coverage nodes are the rules'.
    assert nodes["coverage_check"][0]["answered_by"] == "rules", nodes
    assert nodes["validators"] == [
        {"provider": "workflow", "model": "", "answered_by": "rules", "runs": 2}
    ], nodes

    text = design_show(settings, project, "--text")
    assert text.returncode == 0, text.stderr
    assert f"repair round 1: {round1['findings']} findings (" in text.stdout, text.stdout
    assert f"1 file changed ({HANDLER}); then all passed" in text.stdout, text.stdout
    assert "nodes (who answered):" in text.stdout
    assert "    codegen: local (litellm)" in text.stdout
    assert "    coverage_check: rules" in text.stdout
    # In the pipeline's order, the repair round after the validators.
    order = [n["node"] for n in view["nodes"]]
    assert order[:2] == ["intake_extract", "coverage_check"], order
    assert order.index("codegen") < order.index("validators") < order.index("repair"), order
    assert order[-1] == "diff_and_persist", order

    # The API reads the same rounds and nodes.
    app = create_app(with_tokens(settings), client=client)
    async with asgi_client(app) as http:
        got = await http.get(f"/design/decision-sets/{inp.decision_set}", headers=auth("alice"))
        assert got.status_code == 200, got.text
        details = got.json()
    assert details["repairs"] == view["repairs"]
    assert details["nodes"] == view["nodes"]
