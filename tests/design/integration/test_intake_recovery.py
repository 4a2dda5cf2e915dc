"""Free text never fails a session (issue 24 §0), on a real dev server and worker with the
intake model a scripted OpenAI-compatible server: a reply out of range or not JSON at all
is re-asked once with the problems, then what still does not fit becomes questions with
the valid fields kept; only a model that cannot be reached fails the run, saying which
model, where, and what to check. Every list shows the set's true status meanwhile."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from api.app import create_app
from client import design as design_client
from client.design import start_design
from client.temporal import cause_chain
from keel.design.reasons import node_idempotency_key
from keel.design.steps import ERROR_DESIGN_MODEL_UNREACHABLE, DesignAnswers, DesignInput
from keel.settings import Settings
from services.processes import free_port
from store.db import get_sessionmaker
from store.models import LLMCallRow
from tests.support.api import asgi_client, auth, with_tokens
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

TEXT = (
    "Nightly retraining of a churn model on 200 GB/day of event data in eu-west-1, GDPR, "
    "batch scoring plus a low-latency API under 100 ms, budget under $2k/month"
)
#: Every required field stated and valid; the availability read as 9.5 (a fraction of a
#: nine), which the schema's minimum of 90 refuses.
OUT_OF_RANGE = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "medium",
    "workload_types": ["batch", "online"],
    "data_classification": "confidential",
    "sla_latency_ms": 100,
    "compliance": ["gdpr"],
    "availability_target": 9.5,
}
#: What the rules read from TEXT beyond OUT_OF_RANGE (keel/design/intake_rules.py).
RULES_MORE = {"throughput": {"data_gb_per_day": 200.0}, "training_runs_per_month": 30.0}
#: A paragraph that states nothing rules can read: what the model gives decides.
VAGUE = "A churn model for our marketing team, on the usual stack."


async def start(client: Client, settings: Settings, **kw: Any) -> WorkflowHandle[Any, Any]:
    project = kw.pop("project", f"p-{uuid.uuid4().hex[:8]}")
    inp = DesignInput(
        project=project,
        decision_set="ds1",
        requester="alice",
        requirements=kw.pop("requirements", TEXT),
        require_approval=False,
        generate=False,
        **kw,
    )
    return await start_design(client, inp, task_queue=settings.task_queue)


async def questions_of(client: Client, handle: WorkflowHandle[Any, Any]) -> dict[str, str]:
    """``{field: reason}`` of the open questions, once the pipeline asks."""
    _, project, ds = handle.id.split("/")
    for _ in range(300):
        status = await design_client.status(client, project, ds)
        if status is not None and status.phase == "waiting_for_answers":
            return {q.field: q.reason for q in status.questions}
        await asyncio.sleep(0.1)
    raise AssertionError("the pipeline never asked")


async def test_out_of_range_reply_is_reasked_then_asked_with_the_valid_fields_kept(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    bad = json.dumps({"constraints": OUT_OF_RANGE, "ambiguous": {}})
    # The re-ask gets the same answer: a small model often repeats itself.
    with ScriptedOpenAIServer([ScriptedReply(content=bad), ScriptedReply(content=bad)]) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings):
            # Its own project: the Temporal server is shared by the whole session.
            project = f"acme-{uuid.uuid4().hex[:8]}"
            handle = await start(client, settings, project=project)
            asked = await questions_of(client, handle)
            assert list(asked) == ["availability_target"]
            assert "the model read 9.5" in asked["availability_target"]
            assert "greater than or equal to 90" in asked["availability_target"]
            await handle.execute_update(
                "answers", DesignAnswers(answers={"availability_target": 99.5}, actor="alice")
            )
            result = await handle.result()
        first, second = (r.json for r in srv.chat_requests)
    assert first is not None and second is not None
    # Both calls ask for schema-constrained output in the server's form.
    for req in (first, second):
        assert req["response_format"]["type"] == "json_object"
        assert "constraints" in req["response_format"]["schema"]["properties"]
    # The re-ask is the conversation so far, the bad reply, and the problems found in it.
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2]["content"] == bad
    recovery = second["messages"][3]["content"]
    assert (
        "constraints.availability_target: Input should be greater than or equal to 90 (got 9.5)"
        in recovery
    )

    assert result.status == "completed"
    kept = result.constraints.model_dump(mode="json", exclude_defaults=True)
    assert kept == {**OUT_OF_RANGE, **RULES_MORE, "availability_target": 99.5}
    assert result.nodes_run[:3] == ["intake_extract", "coverage_check", "adaptive_questions"]
    # Both calls are recorded under the intake node's key.
    key = node_idempotency_key(
        f"design/{project}/ds1", "intake_extract", {"text": TEXT, "model": ""}
    )
    sm = get_sessionmaker(settings.resolved_database_url)
    with sm() as s:
        calls = set(s.scalars(select(LLMCallRow.call_key)).all())
    assert {f"{key}/1", f"{key}/1/reask"} <= calls


async def test_garbage_reply_goes_to_questions_never_to_failure(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    replies = [
        ScriptedReply(content="I think you want AWS. Let me know!"),
        # The re-ask is JSON, cut off at the token limit: what came before the cut is kept.
        ScriptedReply(content='{"constraints": {"cloud": "aws", "regions": ["eu-west-1"], "bud'),
    ]
    with ScriptedOpenAIServer(replies) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings):
            # TEXT would be covered by the rules alone (test_intake_paragraph.py).
            handle = await start(client, settings, requirements=VAGUE)
            asked = await questions_of(client, handle)
            rest = {
                "budget_band": "medium",
                "workload_types": ["batch"],
                "data_classification": "internal",
            }
            await handle.execute_update("answers", DesignAnswers(answers=rest, actor="alice"))
            result = await handle.result()
        second = srv.chat_requests[1].json
    assert second is not None
    assert "the reply is not JSON" in second["messages"][-1]["content"]
    # cloud and regions were kept; the questions are about what is still missing.
    assert "cloud" not in asked and "regions" not in asked
    assert {"budget_band", "workload_types"} & set(asked)
    assert result.status == "completed"
    kept = result.constraints.model_dump(mode="json", exclude_defaults=True)
    assert kept == {"cloud": "aws", "regions": ["eu-west-1"], **rest}


async def test_a_failed_reask_keeps_what_fits_of_the_first_reply(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    bad = json.dumps({"constraints": OUT_OF_RANGE, "ambiguous": {}})
    refused = ScriptedReply(status=400, content="the re-ask was refused")
    with ScriptedOpenAIServer([ScriptedReply(content=bad), refused]) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings):
            handle = await start(client, settings)
            asked = await questions_of(client, handle)
            await handle.execute_update(
                "answers", DesignAnswers(answers={"availability_target": 99.9}, actor="alice")
            )
            result = await handle.result()
        assert len(srv.chat_requests) == 2
    assert list(asked) == ["availability_target"]
    assert result.status == "completed"
    kept = result.constraints.model_dump(mode="json", exclude_defaults=True)
    assert kept == {**OUT_OF_RANGE, **RULES_MORE, "availability_target": 99.9}


async def test_unreachable_model_fails_the_run_saying_what_to_check(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    settings.models_config = write_models_config(tmp_path / "models.yaml", nowhere)
    app = create_app(with_tokens(settings), client=client)
    async with build_worker(client, settings), asgi_client(app) as http:
        project = f"p-{uuid.uuid4().hex[:8]}"
        created = await http.post(
            "/design/projects", json={"id": project, "name": project}, headers=auth("alice")
        )
        assert created.status_code == 201, created.text
        started = await http.post(
            f"/design/projects/{project}/constraints",
            json={"requirements": TEXT, "generate": False},
            headers=auth("alice"),
        )
        assert started.status_code == 202, started.text
        ds = started.json()["decision_set_id"]
        # While the intake retries, the list says running, not submitted.
        assert await listed_status(http, project, ds) == "running"
        handle = design_client.handle_of(client, project, ds)
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
        assert await listed_status(http, project, ds) == "failed"
        view = (await http.get(f"/design/decision-sets/{ds}", headers=auth("alice"))).json()
        events = (
            await http.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))
        ).json()
    cause = cause_chain(info.value)[-1]
    message = str(cause)
    assert getattr(cause, "type", None) == ERROR_DESIGN_MODEL_UNREACHABLE
    assert "intake model 'local' (openai/scripted)" in message
    assert nowhere in message
    assert "Check that its server is running" in message and "configs/models.yaml" in message
    # The run-error event the console shows carries the same words.
    assert events["events"][-1]["type"] == "run-error"
    assert events["events"][-1]["payload"]["message"] == message
    assert view["stored"]["status"] == "failed"
    # Written on the row too, so readers after the history is gone see it.
    sm = get_sessionmaker(settings.resolved_database_url)
    from store.design import decision_set

    row = decision_set(sm, project, ds)
    assert row is not None and row["status"] == "failed"


async def listed_status(http: httpx.AsyncClient, project: str, ds: str) -> str:
    resp = await http.get(f"/design/projects/{project}/decision-sets", headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    [row] = [d for d in resp.json()["decision_sets"] if d["id"] == ds]
    return str(row["status"])
