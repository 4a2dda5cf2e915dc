"""The teacher asked for the step's JSON form where the model's server decodes against a
schema (configs/models.yaml ``structured_output``), on a real Temporal server, real jail
and real ast-grep, with the model behind a scripted OpenAI-compatible HTTP server:
the request carries the schema in the server's form, a JSON answer is verified, thinking
output stays well-formed, and a cut answer is recorded as truncated."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.step import step_schema
from keel.srl.steps import CollectionInput, CollectionResult
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.srl.conftest import HAND_TASKS, tasks_jsonl
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER
from workers.main import build_worker

SWAP = {"pattern": "divide($A, $B)", "rewrite": "divide($B, $A)", "language": "python"}
JSON_ANSWER = json.dumps(
    {"think": "swap the arguments", "action": SWAP, "state_update": {"decisions": ["swap"]}}
)
TASK = next(t for t in HAND_TASKS if t["task_id"] == "py-swap")


def _thinking_reply(content: str, reasoning: str) -> ScriptedReply:
    """A reply as a Qwen3-style server sends it: reasoning apart from the content."""
    return ScriptedReply(
        body={
            "id": "chatcmpl-think",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "reasoning_content": reasoning,
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        }
    )


async def _collect(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    replies: list[ScriptedReply],
    structured_output: str = "json_object_schema",
    max_steps: int = 1,
) -> tuple[str, CollectionResult, list[Any]]:
    with ScriptedOpenAIServer(replies) as srv:
        settings.models_config = write_models_config(
            tmp_path / "models.yaml", srv.base_url, structured_output
        )
        async with build_worker(client, settings):
            collection = f"structured-{uuid.uuid4().hex[:8]}"
            digest, count = upload_tasks(
                artifact_store_from_settings(settings), tasks_jsonl([TASK])
            )
            inp = CollectionInput(
                collection=collection,
                tasks_digest=digest,
                task_count=count,
                source="teacher",
                model="local",
                max_steps=max_steps,
            )
            handle = await start_collection(client, inp, task_queue=settings.task_queue)
            result = await handle.result()
        requests = [r.json for r in srv.chat_requests]
    return collection, result, requests


async def test_a_schema_constrained_teacher_answers_in_the_json_form(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    collection, result, [sent] = await _collect(
        client, settings, tmp_path, [ScriptedReply(content=JSON_ANSWER)]
    )
    # llama.cpp's form, with the step schema held to the task's language.
    assert sent["response_format"] == {"type": "json_object", "schema": step_schema("python")}
    assert '"think"' in sent["messages"][0]["content"]
    assert "<action>" not in sent["messages"][0]["content"]
    assert (result.totals.steps, result.totals.verified_steps) == (1, 1)
    assert result.totals.format_errors == 0
    [row] = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    record = json.loads(row.record_json)
    assert record["model_output"]["raw"] == JSON_ANSWER
    assert record["model_output"]["think"] == "swap the arguments"
    assert record["model_output"]["structured"] is True
    assert row.verified and row.format_ok


async def test_openais_form_for_a_server_that_takes_it(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    _, result, [sent] = await _collect(
        client, settings, tmp_path, [ScriptedReply(content=JSON_ANSWER)], "json_schema"
    )
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "srl_step", "schema": step_schema("python")},
    }
    assert result.totals.verified_steps == 1


async def test_a_server_without_schemas_keeps_the_tag_form(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    collection, result, [sent] = await _collect(
        client, settings, tmp_path, [ScriptedReply(content=SWAP_ANSWER)], "none"
    )
    assert "response_format" not in sent
    assert "<action>" in sent["messages"][0]["content"]
    assert result.totals.verified_steps == 1
    [row] = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    assert json.loads(row.record_json)["model_output"]["structured"] is False


async def test_thinking_output_does_not_make_a_good_answer_malformed(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    no_think = json.dumps({**json.loads(JSON_ANSWER), "think": ""})
    replies = [
        # reasoning_content beside a JSON answer with an empty think
        _thinking_reply(no_think, "The call must swap its arguments."),
        # the reasoning left in the content, before the JSON
        ScriptedReply(content="<think>Swap them.</think>\n" + JSON_ANSWER),
    ]
    for reply, think in zip(
        replies, ("The call must swap its arguments.", "swap the arguments"), strict=True
    ):
        collection, result, _ = await _collect(client, settings, tmp_path, [reply])
        assert result.totals.format_errors == 0 and result.totals.verified_steps == 1
        [row] = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
        assert json.loads(row.record_json)["model_output"]["think"] == think


async def test_an_answer_cut_at_max_tokens_is_recorded_as_truncated(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    cut = ScriptedReply(content=JSON_ANSWER[:50], finish_reason="length")
    collection, result, _ = await _collect(client, settings, tmp_path, [cut])
    assert result.totals.format_errors == 1
    [row] = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    error = json.loads(row.record_json)["model_output"]["format_error"]
    assert error.startswith("truncated:")
