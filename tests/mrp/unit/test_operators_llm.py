"""CachedLLMClient and the egress guard, against the real scripted OpenAI HTTP server."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from activities.mrp.egress import EgressDenied, egress_guard, guarded_operator
from activities.mrp.llm import CachedLLMClient, LLMCallFailed, LLMReplayMiss
from activities.mrp.operators import invoke_map, load_mrp_config
from keel.llm import ModelsConfig, ModelSpec
from keel.mrp.registry import OperatorSpec
from keel.mrp.sdk import AgentBase, OperatorContext, OperatorError
from keel.settings import Settings
from store.artifacts import LocalArtifactStore
from tests.support.scripted_openai import RecordedRequest, ScriptedOpenAIServer, ScriptedReply


def by_prompt(req: RecordedRequest) -> ScriptedReply:
    """Answer like a sentiment model: the label follows words in the prompt."""
    text = str((req.json or {}).get("messages", [{}])[-1].get("content", "")).lower()
    if "loved" in text:
        return ScriptedReply(content=" Positive.", prompt_tokens=40, completion_tokens=2)
    if "awful" in text:
        return ScriptedReply(content="negative", prompt_tokens=40, completion_tokens=1)
    return ScriptedReply(content="I am not sure", prompt_tokens=40, completion_tokens=4)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=by_prompt) as srv:
        yield srv


def models_for(srv: ScriptedOpenAIServer) -> ModelsConfig:
    return ModelsConfig(
        default="scripted",
        models={
            "scripted": ModelSpec(
                litellm_model="openai/scripted",
                api_base=srv.base_url,
                params={"max_tokens": 16},
                input_cost_per_token=0.001,
                output_cost_per_token=0.002,
            )
        },
    )


def make_client(srv: ScriptedOpenAIServer, root: Path, **kw: object) -> CachedLLMClient:
    return CachedLLMClient(models_for(srv), LocalArtifactStore(root), **kw)  # type: ignore[arg-type]


def test_cache_hit_makes_no_second_http_request(server: ScriptedOpenAIServer, tmp_path: Path):
    client = make_client(server, tmp_path / "artifacts")
    first = client.complete("I loved it", temperature=0, seed=7)
    assert first.content == " Positive."
    assert not first.cached
    assert first.usage.prompt_tokens == 40
    assert first.cost_usd == Decimal("0.044")  # 40 * 0.001 + 2 * 0.002
    assert len(server.chat_requests) == 1
    body = server.chat_requests[0].json
    assert body["temperature"] == 0 and body["seed"] == 7 and body["max_tokens"] == 16

    second = client.complete([{"role": "user", "content": "I loved it"}], temperature=0, seed=7)
    assert second.cached
    assert second.content == first.content
    assert second.cost_usd == 0
    assert second.request_digest == first.request_digest
    assert len(server.chat_requests) == 1
    assert (client.stats.calls, client.stats.cache_hits) == (1, 1)
    assert client.stats.cost_usd == Decimal("0.044")

    # Another client on the same store (another worker, a later run) hits the cache too.
    other = make_client(server, tmp_path / "artifacts")
    assert other.complete("I loved it", temperature=0, seed=7).cached
    assert len(server.chat_requests) == 1

    # A different parameter is a different request.
    assert not client.complete("I loved it", temperature=0, seed=8).cached
    assert len(server.chat_requests) == 2


def test_a_schema_goes_to_the_server_in_its_form_and_names_its_own_cache_entry(
    server: ScriptedOpenAIServer, tmp_path: Path
):
    """An operator's ``json_schema``: sent as the model's config says (here llama.cpp's
    form), part of the request's digest only when given (older digests hold)."""
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    models = models_for(server)
    spec = models.models["scripted"].model_copy(update={"structured_output": "json_object_schema"})
    client = CachedLLMClient(
        ModelsConfig(default="scripted", models={"scripted": spec}),
        LocalArtifactStore(tmp_path / "artifacts"),
    )
    plain = client.complete("I loved it", json_mode=True)
    constrained = client.complete("I loved it", json_mode=True, json_schema=schema)
    assert plain.request_digest != constrained.request_digest and not constrained.cached
    first, second = server.chat_requests
    assert first.json["response_format"] == {"type": "json_object"}
    assert second.json["response_format"] == {"type": "json_object", "schema": schema}
    assert client.complete("I loved it", json_mode=True, json_schema=schema).cached
    assert len(server.chat_requests) == 2


def test_replay_only_refuses_a_cache_miss(server: ScriptedOpenAIServer, tmp_path: Path):
    recorder = make_client(server, tmp_path / "a")
    recorded = recorder.complete("It was awful", temperature=0)
    replay = make_client(server, tmp_path / "a", replay_only=True)
    assert replay.complete("It was awful", temperature=0).content == recorded.content
    with pytest.raises(LLMReplayMiss) as info:
        replay.complete("It was awful!", temperature=0)
    assert not info.value.retryable
    assert info.value.request_digest.startswith("blake3:")
    assert len(server.chat_requests) == 1


def test_forks_count_their_own_calls(server: ScriptedOpenAIServer, tmp_path: Path):
    client = make_client(server, tmp_path)
    a, b = client.fork(), client.fork()
    a.complete("x")
    b.complete("x")
    b.complete("y")
    assert (a.stats.calls, a.stats.cache_hits) == (1, 0)
    assert (b.stats.calls, b.stats.cache_hits) == (1, 1)
    assert client.stats.calls == 0
    assert len(b.stats.request_digests) == 2


def test_model_errors_keep_the_gateways_retryability(tmp_path: Path):
    with ScriptedOpenAIServer(
        [ScriptedReply(status=400, content="bad prompt"), ScriptedReply(status=503, content="busy")]
    ) as srv:
        client = make_client(srv, tmp_path)
        with pytest.raises(LLMCallFailed) as bad:
            client.complete("a")
        assert bad.value.error_type == "LLMBadRequest" and not bad.value.retryable
        with pytest.raises(LLMCallFailed) as busy:
            client.complete("a")
        assert busy.value.error_type == "LLMServerError" and busy.value.retryable
        with pytest.raises(LLMCallFailed, match="unknown model"):
            client.complete("a", model="nope")
        # Failures are not cached.
        assert client.complete("a").content == "ok"


# -- the egress guard ---------------------------------------------------------------------


def test_raw_network_in_operator_code_is_refused_while_the_llm_client_succeeds(
    server: ScriptedOpenAIServer, tmp_path: Path
):
    client = make_client(server, tmp_path)
    port = server.port
    with egress_guard("probe@1.0.0", allowed=["llm"]):
        assert guarded_operator() == "probe@1.0.0"
        with pytest.raises(EgressDenied, match=r"probe@1\.0\.0"):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            with pytest.raises(EgressDenied, match=r"socket\.connect"):
                s.connect(("127.0.0.1", port))
        finally:
            s.close()
        with pytest.raises(EgressDenied, match=r"urllib\.Request"):
            urllib.request.urlopen(f"{server.base_url}/models", timeout=2)
        with pytest.raises(EgressDenied, match=r"subprocess\.Popen"):
            subprocess.run([sys.executable, "-c", "pass"], check=False)
        # The one way out: the LLM client.
        assert client.complete("I loved it").content == " Positive."
        # And the guard is back on after its call.
        with pytest.raises(EgressDenied):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    assert guarded_operator() is None
    assert len(server.chat_requests) == 1
    # Outside operator code the network is the process's own business.
    with urllib.request.urlopen(f"{server.base_url}/models", timeout=5) as r:
        assert r.status == 200


def test_threads_started_by_operator_code_stay_guarded(server: ScriptedOpenAIServer):
    errors: list[BaseException] = []

    def reach_out() -> None:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        except BaseException as e:
            errors.append(e)

    with egress_guard("probe@1.0.0", allowed=["llm"]):
        t = threading.Thread(target=reach_out)
        t.start()
        t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], EgressDenied)
    # A thread started outside operator code is not guarded.
    t = threading.Thread(target=reach_out)
    t.start()
    t.join(10)
    assert len(errors) == 1


def test_operator_without_llm_egress_cannot_use_the_client(
    server: ScriptedOpenAIServer, tmp_path: Path
):
    client = make_client(server, tmp_path)
    with (
        egress_guard("pure@1.0.0", allowed=[]),
        pytest.raises(EgressDenied, match="no 'llm' egress"),
    ):
        client.complete("hello")
    assert server.chat_requests == []


class Sneaky(AgentBase):
    """Uses the LLM client, then tries to post its input somewhere else."""

    def map(self, items, ctx):  # type: ignore[no-untyped-def]
        label = ctx.llm.complete(str(items[0])).content
        urllib.request.urlopen(ctx.params["url"], data=b"exfiltrate", timeout=2)
        return {"label": label}


def test_invoke_map_turns_egress_into_a_non_retryable_operator_error(
    server: ScriptedOpenAIServer, tmp_path: Path
):
    spec = OperatorSpec(
        name="sneaky",
        version="1.0.0",
        kind="map",  # type: ignore[arg-type]
        entrypoint="agent:Sneaky",
        egress=["llm"],
        code_digest="blake3:" + "0" * 64,
    )
    ctx = OperatorContext(
        params={"url": server.base_url + "/models"},
        llm=make_client(server, tmp_path),
        operator=spec.ref,
    )
    with pytest.raises(OperatorError) as info:
        invoke_map(spec, Sneaky(), ["I loved it"], ctx)
    assert not info.value.retryable
    assert "egress refused" in str(info.value)
    assert len(server.chat_requests) == 1  # the LLM call went through, nothing else did
    assert [r.path for r in server.requests] == ["/v1/chat/completions"]


# -- the shipped LLM-backed operator --------------------------------------------------------


def test_sentiment_label_operator_end_to_end_and_replayed(
    server: ScriptedOpenAIServer, tmp_path: Path
):
    cfg = load_mrp_config(Settings(env="test"))
    ref = "sentiment-label@1.0.0"
    spec, agent = cfg.registry.get(ref), cfg.load(ref)
    items: list[Any] = [
        {"id": 1, "text": "I loved it"},
        {"id": 2, "text": "It was awful"},
        "It was fine",  # the scripted model answers "I am not sure": no label word
    ]

    def run(client: CachedLLMClient, params: dict[str, Any] | None = None) -> object:
        ctx = OperatorContext(
            params=params or {}, seed=2**40 + 3, shard_id="shard-000000", llm=client, operator=ref
        )
        return invoke_map(spec, agent, items, ctx)

    live = make_client(server, tmp_path / "store")
    out = run(live)
    # A reply with no label word is counted as unlabeled, not passed off as neutral.
    assert out == {
        "labels": [
            {"index": 0, "label": "positive", "id": 1},
            {"index": 1, "label": "negative", "id": 2},
            {"index": 2, "label": "unlabeled"},
        ],
        "counts": {"negative": 1, "neutral": 0, "positive": 1, "unlabeled": 1},
    }
    assert len(server.chat_requests) == 3
    for req in server.chat_requests:
        assert req.json["temperature"] == 0
        assert req.json["seed"] == (2**40 + 3) % 2**31
        assert req.json["max_tokens"] == 4
    assert live.stats.calls == 3

    replay = make_client(server, tmp_path / "store", replay_only=True)
    assert run(replay) == out
    assert replay.stats.cache_hits == 3 and replay.stats.calls == 0
    assert len(server.chat_requests) == 3

    # A job may still file such replies under a label on purpose; the requests are the
    # same, so the cache answers them.
    chosen = run(make_client(server, tmp_path / "store", replay_only=True), {"fallback": "neutral"})
    assert chosen == {
        "labels": [
            {"index": 0, "label": "positive", "id": 1},
            {"index": 1, "label": "negative", "id": 2},
            {"index": 2, "label": "neutral"},
        ],
        "counts": {"negative": 1, "neutral": 1, "positive": 1},
    }
