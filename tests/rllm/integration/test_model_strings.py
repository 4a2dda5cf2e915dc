"""A ``.rllm`` file names its model as a LiteLLM model string (``llm: {provider: openai,
model: ...}``), as dotprompt and Prompty files do: the RllmApp workflow runs it through
the gateway without a models.yaml entry, on an OpenAI-compatible server that only the
environment names (``OPENAI_API_BASE``, ``OPENAI_API_KEY``: LiteLLM's conventions).

Real dev server, real worker, two scripted OpenAI servers over HTTP: ``config_llm`` is
the models config's ``local`` entry (``openai/scripted``), ``env_llm`` the one the
environment points at.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from keel.rllm.errors import MetadataValidationError, error_from_payload
from keel.settings import Settings
from store.rllm_stats import list_runs
from tests.rllm.integration.test_app import app_text, failure, make_worker, run_app, stats_db
from tests.support.history import activity_names
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, models_yaml

pytestmark = pytest.mark.timeout(120)

ANSWER = '{"answer": "from the env server"}'
# Not a real key; the test checks it reaches the server and nothing else.
ENV_KEY = "sk-keel-test-env-key-1234"


@pytest.fixture
def config_llm() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=ScriptedReply(content='{"answer": "from config"}')) as s:
        yield s


@pytest.fixture
def env_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedOpenAIServer]:
    """The server ``openai/<model>`` reaches by LiteLLM's environment conventions only."""
    with ScriptedOpenAIServer(default=ScriptedReply(content=ANSWER)) as srv:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
        yield srv


def settings_with(settings: Settings, tmp_path: Path, text: str) -> Settings:
    cfg = tmp_path / "models.yaml"
    cfg.write_text(text)
    return settings.model_copy(update={"models_config": cfg})


@pytest.fixture
def model_settings(
    settings: Settings, config_llm: ScriptedOpenAIServer, tmp_path: Path
) -> Settings:
    return settings_with(settings, tmp_path, models_yaml(config_llm.base_url))


@pytest.fixture
async def model_worker(client: Client, model_settings: Settings) -> AsyncIterator[Worker]:
    async with make_worker(client, model_settings) as w:
        yield w


def naming(llm: str, **kw: object) -> dict[str, str]:
    """A one-file bundle whose app names ``llm`` (a flow mapping) as its model."""
    text = app_text(**kw)  # type: ignore[arg-type]
    old = "llm: {provider: keel, model: local}\n"
    assert old in text
    return {"probe.rllm": text.replace(old, f"llm: {llm}\n")}


async def test_an_app_names_a_litellm_model_the_config_does_not_list(
    client: Client,
    model_settings: Settings,
    model_worker: Worker,
    config_llm: ScriptedOpenAIServer,
    env_llm: ScriptedOpenAIServer,
) -> None:
    files = naming("{provider: openai, model: env-model}")
    result, handle = await run_app(client, model_settings, "probe.rllm", files, "x")

    assert result.output == {"answer": "from the env server"}
    assert result.model == "openai/env-model"
    assert result.attempts[0].model_name == "openai/env-model"
    assert config_llm.chat_requests == []
    (req,) = env_llm.chat_requests
    assert req.json["model"] == "env-model"
    assert req.headers["authorization"] == f"Bearer {ENV_KEY}"
    # LiteLLM does not know env-model takes a schema: JSON mode, the app checks the answer.
    assert req.json["response_format"] == {"type": "json_object"}
    assert await activity_names(handle) == ["rllm.load", "rllm.generate", "rllm.record_stats"]
    (run,) = list_runs(stats_db(model_settings), "probe")
    assert run.model == "openai/env-model" and run.status == "ok"

    # The key is the worker's, read at call time: not in the run's history.
    history = json.dumps((await handle.fetch_history()).to_json_dict())
    assert ENV_KEY not in history


async def test_a_string_an_entry_serves_runs_with_that_entry(
    client: Client,
    model_settings: Settings,
    model_worker: Worker,
    config_llm: ScriptedOpenAIServer,
    env_llm: ScriptedOpenAIServer,
) -> None:
    """``openai/scripted`` is the ``local`` entry's litellm_model: its endpoint applies,
    not the environment's, and the run reports the entry's name."""
    files = naming("{provider: openai, model: scripted}")
    result, _ = await run_app(client, model_settings, "probe.rllm", files, "x")
    assert result.output == {"answer": "from config"} and result.model == "local"
    assert env_llm.chat_requests == [] and len(config_llm.chat_requests) == 1
    # The entry's structured-output form (llama.cpp's) applies too.
    assert config_llm.chat_requests[0].json["response_format"]["type"] == "json_object"
    assert "schema" in config_llm.chat_requests[0].json["response_format"]


async def test_an_old_app_naming_a_config_entry_is_unchanged(
    client: Client,
    model_settings: Settings,
    model_worker: Worker,
    config_llm: ScriptedOpenAIServer,
    env_llm: ScriptedOpenAIServer,
) -> None:
    result, _ = await run_app(client, model_settings, "probe.rllm", {"probe.rllm": app_text()}, "x")
    assert result.output == {"answer": "from config"} and result.model == "local"
    assert env_llm.chat_requests == []


async def test_the_override_takes_a_model_string(
    client: Client,
    model_settings: Settings,
    model_worker: Worker,
    config_llm: ScriptedOpenAIServer,
    env_llm: ScriptedOpenAIServer,
) -> None:
    """``--model openai/...`` (``RllmRunInput.model``) on an app that names ``keel/local``."""
    files = {"probe.rllm": app_text()}
    result, _ = await run_app(
        client, model_settings, "probe.rllm", files, "x", model="openai/other-model"
    )
    assert result.model == "openai/other-model"
    assert [r.json["model"] for r in env_llm.chat_requests] == ["other-model"]
    assert config_llm.chat_requests == []


async def test_the_allow_list_refuses_a_model_it_does_not_list(
    client: Client,
    settings: Settings,
    config_llm: ScriptedOpenAIServer,
    env_llm: ScriptedOpenAIServer,
    tmp_path: Path,
) -> None:
    allow = 'allow: ["anthropic/claude-*", "openai/gpt-4o*"]\n'
    s = settings_with(settings, tmp_path, models_yaml(config_llm.base_url) + allow)
    async with make_worker(client, s):
        files = naming("{provider: openai, model: env-model}")
        cause, payload, handle = await failure(client, s, "probe.rllm", files, "x")
        assert cause.type == "MetadataValidationError" and cause.non_retryable
        assert isinstance(error_from_payload(payload), MetadataValidationError)
        assert "'openai/env-model'" in cause.message
        assert "anthropic/claude-*, openai/gpt-4o*" in cause.message
        assert payload["details"]["allow"] == ["anthropic/claude-*", "openai/gpt-4o*"]
        assert await activity_names(handle) == ["rllm.load"]

        # The configured entry stays allowed, by name and by its string.
        files = naming("{provider: openai, model: scripted}")
        result, _ = await run_app(client, s, "probe.rllm", files, "x")
        assert result.model == "local"
    assert env_llm.chat_requests == []


async def test_a_missing_key_is_named(
    client: Client,
    model_settings: Settings,
    model_worker: Worker,
    env_llm: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    files = naming("{provider: openai, model: env-model}")
    cause, _, handle = await failure(client, model_settings, "probe.rllm", files, "x")
    assert cause.type == "LLMConfigError" and cause.non_retryable
    assert "environment variable OPENAI_API_KEY is not set on the worker" in cause.message
    assert env_llm.chat_requests == []
    # One attempt: a missing variable is not retried.
    names = await activity_names(handle)
    assert names.count("rllm.generate") == 1
