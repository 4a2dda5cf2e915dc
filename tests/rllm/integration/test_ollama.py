"""The Ollama assist against a scripted Ollama HTTP server: list, pull with progress, refuse.

``ensure_models`` is exercised directly, and the ``rllm.ollama_ensure`` activity through
a real worker on the test dev server (its heartbeats carry the pull progress).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.ollama import OllamaActivities, ensure_models
from keel.llm import ModelsConfig, ModelSpec
from keel.rllm.errors import OllamaModelMissingError, error_from_payload
from keel.rllm.ollama import (
    OLLAMA_ENSURE,
    OllamaEnsureInput,
    OllamaEnsureResult,
    OllamaProgress,
    needs_ollama_step,
    normalize_model,
    ollama_model_of,
)
from services.processes import free_port
from tests.support.scripted_ollama import ScriptedOllamaServer


def test_names():
    assert normalize_model("smollm2") == "smollm2:latest"
    assert normalize_model("smollm2:135m") == "smollm2:135m"
    assert normalize_model("registry.example/lib/x") == "registry.example/lib/x:latest"
    assert ollama_model_of("ollama/smollm2:135m") == "smollm2:135m"
    assert ollama_model_of("ollama_chat/llama3.2") == "llama3.2"
    assert ollama_model_of("openai/gpt-4o") is None
    assert ollama_model_of("local") is None
    assert needs_ollama_step(llm_model="ollama/x", override=None, auto_pull=False)
    assert not needs_ollama_step(llm_model="keel/local", override=None, auto_pull=False)
    assert needs_ollama_step(llm_model="keel/local", override=None, auto_pull=True)
    assert not needs_ollama_step(llm_model="ollama/x", override="local", auto_pull=False)


async def test_present_model_is_not_pulled():
    with ScriptedOllamaServer(installed=["smollm2:135m"]) as srv:
        res = await ensure_models(
            srv.base_url, required=["smollm2:135m"], recommended=[], auto_pull=False
        )
        assert res.present == ["smollm2:135m"] and res.pulled == []
        assert srv.pulls == []
        assert [r[:2] for r in srv.requests] == [("GET", "/api/tags")]


async def test_missing_model_without_auto_pull_is_an_error():
    with ScriptedOllamaServer(installed=["llama3.2:latest"]) as srv:
        with pytest.raises(OllamaModelMissingError) as exc:
            await ensure_models(
                srv.base_url, required=["smollm2:135m"], recommended=[], auto_pull=False, app="s"
            )
        payload = exc.value.to_payload()
        assert payload.error_code == "RLLM_OLLAMA_MODEL_MISSING"
        assert payload.details == {"model": "smollm2:135m", "app": "s"}
        assert "--ollama-auto-pull" in payload.recovery_hint
        assert srv.pulls == []


async def test_recommended_models_are_ignored_without_auto_pull():
    with ScriptedOllamaServer() as srv:
        res = await ensure_models(srv.base_url, required=[], recommended=["x"], auto_pull=False)
        assert res.checked == [] and srv.requests == []


async def test_auto_pull_streams_progress_and_installs():
    lines: list[OllamaProgress] = []
    with ScriptedOllamaServer(installed=[], chunks=3) as srv:
        res = await ensure_models(
            srv.base_url,
            required=["smollm2:135m"],
            recommended=["smollm2:135m", "tinyllama"],
            auto_pull=True,
            on_progress=lines.append,
        )
        assert res.pulled == ["smollm2:135m", "tinyllama:latest"]
        assert srv.pulls == ["smollm2:135m", "tinyllama:latest"]
        assert srv.installed == ["smollm2:135m", "tinyllama:latest"]
        again = await ensure_models(
            srv.base_url, required=["smollm2:135m"], recommended=["tinyllama"], auto_pull=True
        )
        assert again.pulled == [] and again.present == ["smollm2:135m", "tinyllama:latest"]
    first = [p for p in lines if p.model == "smollm2:135m"]
    assert first[0].status == "pulling manifest" and first[-1].status == "success"
    sized = [p for p in first if p.total]
    assert [p.completed for p in sized[:3]] == [1333, 2666, 4000]
    assert sized[0].line() == "smollm2:135m: pulling 4a5b 33% (1333/4000 bytes)"


async def test_unknown_model_pull_is_refused():
    with ScriptedOllamaServer(available=["smollm2:135m"]) as srv:
        with pytest.raises(OllamaModelMissingError) as exc:
            await ensure_models(
                srv.base_url, required=["nosuch:1b"], recommended=[], auto_pull=True
            )
        assert "file does not exist" in exc.value.message
        assert exc.value.details["reason"] == "pull model manifest: file does not exist"


async def test_unreachable_server_is_reported():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OllamaModelMissingError) as exc:
        await ensure_models(url, required=["smollm2:135m"], recommended=[], auto_pull=True)
    assert exc.value.details["reason"] == "unreachable"
    assert "KEEL_OLLAMA_BASE_URL" in exc.value.recovery_hint


@workflow.defn(sandboxed=False)
class _EnsureOllama:
    @workflow.run
    async def run(self, req: OllamaEnsureInput) -> OllamaEnsureResult:
        return await workflow.execute_activity(
            OLLAMA_ENSURE.name,
            req,
            result_type=OllamaEnsureResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


async def test_activity_pulls_through_a_models_config_name_and_heartbeats(client: Client):
    with ScriptedOllamaServer(chunks=20, chunk_delay_s=0.1) as srv:
        models = ModelsConfig(
            default="small",
            models={"small": ModelSpec(litellm_model="ollama/smollm2:135m", api_base=srv.base_url)},
        )
        acts = OllamaActivities(f"http://127.0.0.1:{free_port()}", models)  # not used: api_base
        queue = f"ollama-{uuid.uuid4()}"
        async with Worker(
            client, task_queue=queue, workflows=[_EnsureOllama], activities=[acts.ensure]
        ):
            handle = await client.start_workflow(
                _EnsureOllama.run,
                OllamaEnsureInput(app="summary", model="small", auto_pull=True),
                id=f"ollama-test-{uuid.uuid4()}",
                task_queue=queue,
            )
            seen: list[list[Any]] = []
            while not seen:
                desc = await handle.describe()
                for pa in desc.raw_description.pending_activities:
                    if pa.heartbeat_details.payloads:
                        seen.append(
                            await client.data_converter.decode(
                                pa.heartbeat_details.payloads, [dict]
                            )
                        )
                await asyncio.sleep(0.1)
            result = await handle.result()
        assert result.pulled == ["smollm2:135m"] and result.base_url == srv.base_url
        assert seen[0][0]["model"] == "smollm2:135m"


async def test_activity_missing_model_fails_with_the_payload(client: Client):
    with ScriptedOllamaServer() as srv:
        acts = OllamaActivities(srv.base_url)
        queue = f"ollama-{uuid.uuid4()}"
        async with Worker(
            client, task_queue=queue, workflows=[_EnsureOllama], activities=[acts.ensure]
        ):
            with pytest.raises(WorkflowFailureError) as exc:
                await client.execute_workflow(
                    _EnsureOllama.run,
                    OllamaEnsureInput(app="summary", model="ollama/smollm2:135m"),
                    id=f"ollama-test-{uuid.uuid4()}",
                    task_queue=queue,
                )
        assert srv.pulls == []
    cause = exc.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    app_err = cause.cause
    assert app_err.type == "OllamaModelMissingError" and app_err.non_retryable
    err = error_from_payload(app_err.details[0])
    assert isinstance(err, OllamaModelMissingError) and err.exit_code == 19
