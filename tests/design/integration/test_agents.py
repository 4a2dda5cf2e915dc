"""The planner and critic agents on a real dev server with a scripted model configured
as capable (issue 24 §4): a proposal outside the catalogue refused by the rules and
recorded, a critic finding that sends the plan back once, the rules alone when no
capable model is configured (also on the embedded model), and the organisation's policy
file deciding the gate."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from api.app import create_app
from client.design import decision_set_view, start_design
from keel.design.steps import DesignInput, DesignResult
from keel.settings import Settings
from services.model_server import LocalModelServer, unavailable_reason
from store import design as design_store
from store.db import get_sessionmaker
from store.models import AgentRunRow
from tests.design.integration.test_pipeline import decide
from tests.support.api import asgi_client, auth, with_tokens
from tests.support.scripted_openai import RecordedRequest, ScriptedOpenAIServer, ScriptedReply
from workers.main import build_worker

REPO = Path(__file__).resolve().parents[3]
FORM: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "medium",
    "data_classification": "internal",
    "workload_types": ["batch"],
}
#: The rules' plan of FORM (tests/design/unit/test_agents.py shows the candidates).
RULES_PLAN = {
    "ingest": "ingest:s3-batch",
    "transform": "transform:glue-etl",
    "store": "store:s3-lakehouse",
    "feature": "feature:glue-offline-features",
    "train": "train:ecs-fargate-jobs",
    "serve": "serve:sagemaker-batch-transform",
    "observe": "observe:cloudwatch",
    "govern": "govern:lake-formation-cloudtrail",
}
OPENINGS = {
    "You are the planner": "planner",
    "You are the technical critic": "critic_tech",
    "You are the cost critic": "critic_cost",
    "You are the security": "critic_security",
}


def models_yaml(base_url: str) -> str:
    """``local`` (not capable, the default) and ``agent`` (capable), both the scripted
    server."""
    entry = (
        "    litellm_model: openai/scripted\n"
        f"    api_base: {base_url}\n"
        "    input_cost_per_token: 0.0\n"
        "    output_cost_per_token: 0.0\n"
        "    structured_output: json_schema\n"
    )
    return f"default: local\nmodels:\n  local:\n{entry}  agent:\n{entry}    capable: true\n"


class Agents:
    """Answers each agent by its prompt: ``replies[agent]`` in turn (the last repeats)."""

    def __init__(self, replies: dict[str, list[dict[str, Any]]]) -> None:
        self.replies = replies
        self.calls: Counter[str] = Counter()

    def __call__(self, req: RecordedRequest) -> ScriptedReply:
        system = next(m["content"] for m in req.json["messages"] if m["role"] == "system")
        agent = next(a for opening, a in OPENINGS.items() if system.startswith(opening))
        seq = self.replies.get(agent, [{"findings": []}])
        reply = seq[min(self.calls[agent], len(seq) - 1)]
        self.calls[agent] += 1
        return ScriptedReply(content=json.dumps(reply))


def plan_reply(**picked: str) -> dict[str, Any]:
    chosen = {**RULES_PLAN, **picked}
    return {
        "choices": [
            {"capability": k, "pattern_id": v, "why": "scripted"} for k, v in chosen.items()
        ],
        "notes": "scripted planner",
    }


async def run(
    client: Client, settings: Settings, **kw: Any
) -> tuple[DesignResult, WorkflowHandle[Any, Any], str]:
    project = f"p-{uuid.uuid4().hex[:8]}"
    inp = DesignInput(
        project=project,
        decision_set="ds1",
        requester="alice",
        intake=kw.pop("intake", FORM),
        require_approval=False,
        generate=False,
        **kw,
    )
    handle = await start_design(client, inp, task_queue=settings.task_queue)
    return await handle.result(), handle, project


async def activity_types(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def runs_of(settings: Settings, project: str) -> dict[str, list[dict[str, Any]]]:
    sm = get_sessionmaker(settings.resolved_database_url)
    events = design_store.list_events(sm, project, "ds1")
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        out.setdefault(e["type"], []).append(e["payload"])
    return out


async def test_a_proposal_outside_the_catalogue_is_refused_and_recorded(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    agents = Agents(
        {"planner": [plan_reply(serve="serve:triton-gpu-fleet", train="train:sagemaker-training")]}
    )
    with ScriptedOpenAIServer(default=agents) as srv:
        (tmp_path / "models.yaml").write_text(models_yaml(srv.base_url))
        settings.models_config = tmp_path / "models.yaml"
        async with build_worker(client, settings):
            result, handle, project = await run(client, settings, model="agent")
        requests = srv.requests
    assert result.status == "completed"
    assert result.plan is not None
    chosen = {c.capability.value: c.pattern_id for c in result.plan.choices}
    # The eligible alternative is taken; the pattern outside the catalogue is refused and
    # the rules' serving pattern stands.
    assert chosen == {**RULES_PLAN, "train": "train:sagemaker-training"}
    assert dict(agents.calls) == {
        "planner": 1,
        "critic_tech": 1,
        "critic_cost": 1,
        "critic_security": 1,
    }
    # Each agent is its own activity; its request carried the schema (structured output).
    assert (await activity_types(handle)).count("design.agent") == 4
    planner_req = next(
        r.json for r in requests if "planner" in r.json["response_format"]["json_schema"]["name"]
    )
    schema = planner_req["response_format"]["json_schema"]["schema"]
    assert "serve:ecs-fargate-fastapi" in json.dumps(schema)
    events = runs_of(settings, project)
    plan_ready = events["plan-ready"][0]
    refused = plan_ready["agent"]["refused"]
    assert [(r["rule"], r["proposal"]) for r in refused] == [
        ("not_in_catalogue", "serve -> serve:triton-gpu-fleet")
    ]
    assert plan_ready["agent"]["accepted"]["train"] == "train:sagemaker-training"
    cards = {(c["node_name"], (c.get("choice") or {}).get("id")): c for c in events["reason-card"]}
    serve_card = cards[("planner", "serve:sagemaker-batch-transform")]
    assert any(
        "refused planner proposal serve -> serve:triton-gpu-fleet" in r for r in serve_card["risks"]
    )
    assert (
        serve_card["links"]["model"]
        and serve_card["policy_results"]["mandatory_capabilities"] == "pass"
    )
    assert serve_card["impacts"]["cost_tier"] == 1.0
    # Every deciding node left a card with its policy results filled.
    nodes = {c["node_name"] for c in events["reason-card"]}
    assert nodes == {"planner", "critic_tech", "critic_cost", "critic_security", "policy_eval"}
    assert all(c["policy_results"] for c in events["reason-card"])
    sm = get_sessionmaker(settings.resolved_database_url)
    with sm() as session:
        rows = {
            r.agent: r
            for r in session.scalars(
                select(AgentRunRow).where(AgentRunRow.project_id == project)
            ).all()
        }
    # The planner's run is the model's, with its refusals in the recorded output.
    assert rows["planner"].provider == "llm" and rows["planner"].model
    assert rows["planner"].output_json["agent"]["refused"][0]["rule"] == "not_in_catalogue"
    view = decision_set_view(sm, project, "ds1")
    assert view["refused_proposals"][0].startswith("serve -> serve:triton-gpu-fleet: ")


async def test_a_critic_finding_sends_the_plan_back_once(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    finding = {
        "severity": "high",
        "detail": "Fargate jobs cannot hold the training set in memory",
        "patterns": ["train:ecs-fargate-jobs"],
        "revise": True,
    }
    agents = Agents(
        {
            "planner": [plan_reply(), plan_reply(train="train:sagemaker-training")],
            # The same finding every time: the plan still goes back only once.
            "critic_tech": [{"findings": [finding]}],
        }
    )
    with ScriptedOpenAIServer(default=agents) as srv:
        (tmp_path / "models.yaml").write_text(models_yaml(srv.base_url))
        settings.models_config = tmp_path / "models.yaml"
        async with build_worker(client, settings):
            result, _, project = await run(client, settings, model="agent")
        assert srv.requests
    assert result.status == "completed" and result.plan is not None
    assert result.plan_rounds == 2
    assert result.plan.pattern_ids()[4] == "train:sagemaker-training"
    assert agents.calls["planner"] == 2 and agents.calls["critic_tech"] == 2
    assert result.nodes_run.count("planner") == 2 and result.nodes_run.count("critic_security") == 2
    events = runs_of(settings, project)
    first, second = events["plan-ready"]
    assert "revision" not in first and first["round"] == 1
    assert second["round"] == 2 and second["revision"]["avoid"] == ["train:ecs-fargate-jobs"]
    assert any("Fargate jobs" in r for r in second["revision"]["reasons"])
    # `design show` names the round and why the critics sent the plan back.
    view = decision_set_view(get_sessionmaker(settings.resolved_database_url), project, "ds1")
    assert view["plan_round"] == 2 and any("Fargate jobs" in r for r in view["revised_for"])


async def test_rules_decide_alone_without_a_capable_model(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    agents = Agents({"planner": [plan_reply(serve="serve:triton-gpu-fleet")]})
    with ScriptedOpenAIServer(default=agents) as srv:
        (tmp_path / "models.yaml").write_text(models_yaml(srv.base_url))
        settings.models_config = tmp_path / "models.yaml"
        async with build_worker(client, settings):
            result, handle, project = await run(client, settings)  # model "": local
        assert srv.requests == []
    assert result.status == "completed" and result.plan is not None
    assert {c.capability.value: c.pattern_id for c in result.plan.choices} == RULES_PLAN
    assert "design.agent" not in await activity_types(handle)
    assert "agent" not in runs_of(settings, project)["plan-ready"][0]


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
async def test_the_embedded_model_never_reaches_the_agents(
    client: Client, settings: Settings, tmp_path: Path, local_model_server: LocalModelServer
) -> None:
    raw = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    assert raw["models"]["local"]["capable"] is False
    raw["models"]["local"]["api_base"] = local_model_server.base_url
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(raw))
    settings.models_config = tmp_path / "models.yaml"
    async with build_worker(client, settings):
        result, handle, _ = await run(client, settings, model="local")
    assert result.status == "completed"
    assert "design.agent" not in await activity_types(handle)


async def test_the_policy_file_decides_the_gate(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\npolicy:\n  allowed_regions: [us-west-2]\n")
    settings.design_policy = policy
    async with build_worker(client, settings):
        project = f"p-{uuid.uuid4().hex[:8]}"
        inp = DesignInput(
            project=project, decision_set="ds1", requester="alice", intake=FORM,
            require_approval=False, generate=False,
        )  # fmt: skip
        handle = await start_design(client, inp, task_queue=settings.task_queue)
        # eu-west-1 is not allowed: policy fails, so the gate opens though not required.
        await decide(client, handle.id, "plan-r1", "reject")
        strict: DesignResult = await handle.result()
        policy.write_text("version: 1\npolicy:\n  allowed_regions: [eu-west-1, us-west-2]\n")
        relaxed, _, _ = await run(client, settings)
        # The API shows the file the next run reads.
        async with asgi_client(create_app(with_tokens(settings), client=client)) as http:
            view = await http.get("/design/policy", headers=auth("alice"))
    assert strict.status == "rejected" and strict.gate_required
    assert strict.policy is not None and strict.policy.status_of("region_policy") == "fail"
    assert any("region_policy" in r for r in strict.gate_reasons)
    assert relaxed.status == "completed" and not relaxed.gate_required
    assert relaxed.policy is not None and relaxed.policy.status_of("region_policy") == "pass"
    assert view.status_code == 200, view.text
    assert view.json()["policy"]["allowed_regions"] == ["eu-west-1", "us-west-2"]
    assert view.json()["source"] == str(policy)
