"""The ``llm.complete`` activity through real LiteLLM against a real scripted HTTP server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from activities.llm import LLMGateway
from keel.llm import LLMMessage, LLMRequest, ModelsConfig, ModelSpec
from keel.records import LLMCallLog
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply

SECRET = "sk-keel-test-0123456789abcdefSECRET"


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


def make_gateway(base_url: str, logs: list[LLMCallLog] | None = None, **spec: Any) -> LLMGateway:
    fields: dict[str, Any] = {
        "litellm_model": "openai/scripted",
        "api_base": base_url,
        "input_cost_per_token": 0.001,
        "output_cost_per_token": 0.002,
    }
    fields.update(spec)
    config = ModelsConfig(default="scripted", models={"scripted": ModelSpec(**fields)})

    async def on_call(log: LLMCallLog) -> None:
        if logs is not None:
            logs.append(log)

    return LLMGateway(config, on_call=on_call)


def request(**kw: Any) -> LLMRequest:
    return LLMRequest(messages=[LLMMessage(role="user", content="hello")], **kw)


async def fail(gw: LLMGateway, req: LLMRequest) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(gw.complete, req)
    # Nothing of the provider's exception may ride along into history as a cause.
    assert info.value.__cause__ is None
    return info.value


async def test_success_returns_and_records_everything(server: ScriptedOpenAIServer) -> None:
    server.enqueue(ScriptedReply(content='{"answer": 42}', prompt_tokens=7, completion_tokens=2))
    logs: list[LLMCallLog] = []
    gw = make_gateway(server.base_url, logs, params={"max_tokens": 50})
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter

    resp = await env.run(
        gw.complete, request(json_mode=True, params={"temperature": 0.3, "seed": 7})
    )

    assert resp.content == '{"answer": 42}'
    assert resp.model_name == "scripted"
    assert resp.litellm_model == "openai/scripted"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (7, 2)
    assert resp.usage.total_tokens == 9
    assert resp.latency_ms > 0
    assert resp.cost_usd == pytest.approx(7 * 0.001 + 2 * 0.002)
    assert resp.finish_reason == "stop"

    [sent] = server.chat_requests
    assert sent.path == "/v1/chat/completions"
    assert sent.json["model"] == "scripted"
    assert sent.json["messages"] == [{"role": "user", "content": "hello"}]
    assert sent.json["response_format"] == {"type": "json_object"}
    assert sent.json["temperature"] == 0.3
    assert sent.json["seed"] == 7
    assert sent.json["max_tokens"] == 50  # the model's default param
    assert sent.headers["authorization"] == "Bearer no-key"

    [log] = logs
    assert log.status == "ok" and log.error_code is None
    assert log.call_key == "test-run/test/1"
    assert log.workflow_id == "test"
    assert (log.model_name, log.litellm_model, log.provider) == (
        "scripted",
        "openai/scripted",
        "openai",
    )
    assert (log.prompt_tokens, log.completion_tokens, log.total_tokens) == (7, 2, 9)
    assert log.latency_ms == pytest.approx(resp.latency_ms)
    assert log.cost_usd == pytest.approx(resp.cost_usd)

    got: dict[tuple[str, str], int] = {}
    for u in buffer.retrieve_updates():
        label = u.attributes.get("status") or u.attributes.get("kind") or ""
        got[(u.metric.name, str(label))] = got.get((u.metric.name, str(label)), 0) + int(u.value)
    assert got[("keel_llm_calls", "ok")] == 1
    assert got[("keel_llm_tokens", "prompt")] == 7
    assert got[("keel_llm_tokens", "completion")] == 2
    assert ("keel_llm_latency_ms", "ok") in got


@pytest.mark.parametrize("header", ["7", "http-date"])
async def test_429_is_retryable_after_retry_after(
    server: ScriptedOpenAIServer, header: str
) -> None:
    if header == "http-date":
        header = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    server.enqueue(ScriptedReply(status=429, content="slow down", headers={"Retry-After": header}))
    logs: list[LLMCallLog] = []

    before = datetime.now(UTC)
    err = await fail(make_gateway(server.base_url, logs), request())
    after = datetime.now(UTC)

    assert err.type == "LLMRateLimited"
    assert not err.non_retryable
    assert err.next_retry_delay is not None
    if header == "7":
        assert err.next_retry_delay == timedelta(seconds=7)
    else:
        # The date's distance from the gateway's "now", which lies between the two clock
        # readings around the call: exact bounds, however long the call took.
        when = parsedate_to_datetime(header)
        assert when - after <= err.next_retry_delay <= when - before, (before, after)
    [log] = logs
    assert (log.status, log.error_code, log.total_tokens) == ("error", "LLMRateLimited", 0)


@pytest.mark.parametrize(
    ("status", "err_type", "retryable"),
    [(400, "LLMBadRequest", False), (503, "LLMServerError", True)],
)
async def test_http_status_maps_to_retryability(
    server: ScriptedOpenAIServer, status: int, err_type: str, retryable: bool
) -> None:
    server.enqueue(ScriptedReply(status=status, content="scripted failure"))

    err = await fail(make_gateway(server.base_url), request())

    assert err.type == err_type
    assert err.non_retryable is (not retryable)
    assert err.next_retry_delay is None
    assert err.details[0]["status_code"] == status
    assert len(server.chat_requests) == 1  # LiteLLM and the OpenAI client did not retry


async def test_timeout_is_retryable(server: ScriptedOpenAIServer) -> None:
    server.enqueue(ScriptedReply(delay_s=10))

    err = await fail(make_gateway(server.base_url), request(timeout_s=0.5))

    assert err.type == "LLMTimeout"
    assert not err.non_retryable
    assert len(server.chat_requests) == 1


async def test_connection_refused_is_retryable() -> None:
    with ScriptedOpenAIServer() as srv:
        url = srv.base_url
    err = await fail(make_gateway(url), request())
    assert err.type == "LLMConnectionError"
    assert not err.non_retryable


async def test_api_key_never_leaks(
    server: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KEEL_TEST_LLM_KEY", SECRET)
    # Providers do echo the key they were sent in their error text.
    server.enqueue(ScriptedReply(status=401, content=f"Incorrect API key provided: {SECRET}."))
    caplog.set_level(logging.DEBUG)
    logs: list[LLMCallLog] = []

    err = await fail(
        make_gateway(server.base_url, logs, api_key_env="KEEL_TEST_LLM_KEY"), request()
    )

    assert server.chat_requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert err.type == "LLMAuthError"
    assert err.non_retryable
    assert "***" in err.message
    out, errout = capfd.readouterr()
    for text in (str(err), err.message, repr(err.details), caplog.text, out, errout, repr(logs)):
        assert SECRET not in text


async def test_unknown_model_is_final_and_lists_known(server: ScriptedOpenAIServer) -> None:
    logs: list[LLMCallLog] = []
    err = await fail(make_gateway(server.base_url, logs), request(model="gpt-9"))
    assert err.type == "LLMUnknownModel"
    assert err.non_retryable
    assert "'gpt-9'" in err.message and "scripted" in err.message
    assert server.chat_requests == []
    assert logs[0].status == "error" and logs[0].error_code == "LLMUnknownModel"


async def test_missing_key_env_is_final(
    server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KEEL_TEST_ABSENT_KEY", raising=False)
    gw = make_gateway(server.base_url, api_key_env="KEEL_TEST_ABSENT_KEY")
    err = await fail(gw, request())
    assert err.type == "LLMConfigError"
    assert err.non_retryable
    assert "KEEL_TEST_ABSENT_KEY" in err.message
    assert server.chat_requests == []


# -- LiteLLM model strings the config does not list ----------------------------------------


@pytest.fixture
def env_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedOpenAIServer]:
    """A server ``openai/<model>`` reaches through LiteLLM's environment conventions only."""
    with ScriptedOpenAIServer(default=ScriptedReply(content="from env")) as srv:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        monkeypatch.setenv("OPENAI_API_BASE", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        yield srv


async def test_a_model_string_runs_with_litellms_defaults(
    server: ScriptedOpenAIServer, env_server: ScriptedOpenAIServer
) -> None:
    logs: list[LLMCallLog] = []
    resp = await ActivityEnvironment().run(
        make_gateway(server.base_url, logs).complete, request(model="openai/env-model")
    )
    assert resp.content == "from env"
    assert (resp.model_name, resp.litellm_model) == ("openai/env-model", "openai/env-model")
    assert resp.cost_usd is None  # not in LiteLLM's price table, no override
    [sent] = env_server.chat_requests
    assert sent.json["model"] == "env-model"
    assert sent.headers["authorization"] == f"Bearer {SECRET}"
    assert server.chat_requests == []
    assert (logs[0].model_name, logs[0].provider, logs[0].status) == (
        "openai/env-model",
        "openai",
        "ok",
    )


async def test_a_string_an_entry_serves_takes_the_entry(
    server: ScriptedOpenAIServer, env_server: ScriptedOpenAIServer
) -> None:
    gw = make_gateway(server.base_url)
    resp = await ActivityEnvironment().run(gw.complete, request(model="openai/scripted"))
    assert resp.model_name == "scripted" and resp.cost_usd is not None  # the entry's prices
    assert len(server.chat_requests) == 1 and env_server.chat_requests == []


async def test_a_bare_name_litellm_knows_is_qualified(
    server: ScriptedOpenAIServer, env_server: ScriptedOpenAIServer
) -> None:
    """``gpt-4o`` is ``openai/gpt-4o`` to LiteLLM; LiteLLM knows it takes a JSON Schema."""
    resp = await ActivityEnvironment().run(
        make_gateway(server.base_url).complete,
        request(model="gpt-4o", json_mode=True, json_schema={"type": "object"}),
    )
    assert resp.model_name == "openai/gpt-4o" and resp.structured == "json_schema"
    [sent] = env_server.chat_requests
    assert sent.json["model"] == "gpt-4o"
    assert sent.json["response_format"]["type"] == "json_schema"


async def test_a_provider_litellm_does_not_know_is_an_unknown_model(
    server: ScriptedOpenAIServer,
) -> None:
    err = await fail(make_gateway(server.base_url), request(model="nosuchprovider/x"))
    assert err.type == "LLMUnknownModel" and err.non_retryable
    assert "'nosuchprovider'" in err.message


async def test_the_allow_list_refuses_a_string_it_does_not_match(
    server: ScriptedOpenAIServer, env_server: ScriptedOpenAIServer
) -> None:
    logs: list[LLMCallLog] = []
    gw = make_gateway(server.base_url, logs)
    gw.models = gw.models.model_copy(update={"allow": ["anthropic/*", "openai/gpt-4o*"]})
    err = await fail(gw, request(model="openai/env-model"))
    assert err.type == "LLMModelNotAllowed" and err.non_retryable
    assert "'openai/env-model'" in err.message and "anthropic/*, openai/gpt-4o*" in err.message
    assert err.details[0] == {
        "model": "openai/env-model",
        "allow": ["anthropic/*", "openai/gpt-4o*"],
    }
    assert env_server.chat_requests == []
    assert logs[0].error_code == "LLMModelNotAllowed"
    # A matching string and the configured model are called.
    await ActivityEnvironment().run(gw.complete, request(model="openai/gpt-4o-mini"))
    await ActivityEnvironment().run(gw.complete, request(model="scripted"))
    assert len(env_server.chat_requests) == 1 and len(server.chat_requests) == 1


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai/env-model", "OPENAI_API_KEY"),  # OpenAI's client refuses: LiteLLM says 500
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"),  # LiteLLM says 401
    ],
)
async def test_a_missing_provider_key_is_named(
    server: ScriptedOpenAIServer,
    env_server: ScriptedOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    variable: str,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_BASE", env_server.base_url)
    err = await fail(make_gateway(server.base_url), request(model=model))
    assert err.type == "LLMConfigError" and err.non_retryable
    assert f"environment variable {variable} is not set on the worker" in err.message
    assert err.details[0]["missing_env"] == [variable]
    assert env_server.requests == [] and server.requests == []


async def test_a_provider_key_litellm_reads_is_scrubbed(
    server: ScriptedOpenAIServer,
    env_server: ScriptedOpenAIServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gateway passes no key for a model string: LiteLLM reads OPENAI_API_KEY, and its
    value is still replaced in what the failure says."""
    env_server.enqueue(ScriptedReply(status=401, content=f"Incorrect API key provided: {SECRET}."))
    logs: list[LLMCallLog] = []
    with caplog.at_level(logging.DEBUG):
        err = await fail(make_gateway(server.base_url, logs), request(model="openai/env-model"))
    assert err.type == "LLMAuthError" and "***" in err.message
    for text in (str(err), err.message, repr(err.details), caplog.text, repr(logs)):
        assert SECRET not in text
