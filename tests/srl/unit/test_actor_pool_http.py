"""The actor pool over scripted OpenAI-compatible servers (real HTTP on loopback): what it
sends, a 5xx draining an endpoint with the request re-sent, a vLLM-shaped answer's token
ids, and the ``keel_srl_actor_*`` metrics inside an activity."""

from __future__ import annotations

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from activities.actors import ActorPool, Generation
from keel.srl.actors import ActorEndpoint, ActorsConfig
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply

VLLM_BODY = {
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "<think>ok</think>"},
            "logprobs": {
                "content": [
                    {"token": "token_id:151667", "logprob": -0.01, "top_logprobs": []},
                    {"token": "token_id:564", "logprob": -1.5, "top_logprobs": []},
                ]
            },
            "finish_reason": "stop",
            "token_ids": [151667, 564],
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
}


def config(*servers: ScriptedOpenAIServer) -> ActorsConfig:
    return ActorsConfig(
        endpoints=[
            ActorEndpoint(name=f"s{i}", base_url=s.base_url, port=s.port, model="scripted")
            for i, s in enumerate(servers)
        ],
        retry_dead_after_s=600,
    )


async def test_a_5xx_drains_the_endpoint_and_the_request_is_resent() -> None:
    broken = ScriptedReply(status=503, content="engine dead")
    with (
        ScriptedOpenAIServer(default=broken) as s0,
        ScriptedOpenAIServer(default=ScriptedReply(body=VLLM_BODY)) as s1,
    ):
        buffer = MetricBuffer(1000)
        env = ActivityEnvironment()
        env.metric_meter = Runtime(telemetry=TelemetryConfig(metrics=buffer)).metric_meter
        async with ActorPool(config(s0, s1)) as pool:

            async def step() -> Generation:
                return await pool.generate(
                    [{"role": "user", "content": "go"}],
                    max_tokens=16,
                    temperature=0.5,
                    seed=3,
                    stop=["</action>"],
                )

            first = await env.run(step)
            second = await env.run(step)
            snap = {s.name: s for s in pool.snapshot()}

        assert first.attempts == ["s0", "s1"] and first.endpoint == "s1"
        assert first.text == "<think>ok</think>"
        assert first.token_ids == [151667, 564] and first.logprobs == [-0.01, -1.5]
        assert (first.prompt_tokens, first.completion_tokens) == (12, 2)
        # s0 is drained: the second request goes straight to s1.
        assert second.attempts == ["s1"]
        assert len(s0.chat_requests) == 1 and len(s1.chat_requests) == 2
        assert not snap["s0"].healthy and snap["s0"].failures == 1
        assert snap["s0"].last_error is not None and "HTTP 503" in snap["s0"].last_error
        assert snap["s1"].served == 2 and snap["s1"].healthy

        sent = s1.chat_requests[0].json
        assert sent["model"] == "scripted" and sent["messages"] == [
            {"role": "user", "content": "go"}
        ]
        assert (sent["max_tokens"], sent["temperature"], sent["seed"]) == (16, 0.5, 3)
        assert sent["stop"] == ["</action>"]
        assert sent["logprobs"] is True and sent["top_logprobs"] == 1
        assert sent["return_token_ids"] is True and sent["return_tokens_as_token_ids"] is True
        # The same request went to both: the step is re-sent, not changed.
        assert s0.chat_requests[0].json == sent

        failures: dict[tuple[str, str], int] = {}
        latencies: dict[str, int] = {}
        for u in buffer.retrieve_updates():
            if u.metric.name == "keel_srl_actor_failures":
                key = (str(u.attributes["endpoint"]), str(u.attributes["kind"]))
                failures[key] = failures.get(key, 0) + int(u.value)
            elif u.metric.name == "keel_srl_actor_latency_seconds":
                ep = str(u.attributes["endpoint"])
                latencies[ep] = latencies.get(ep, 0) + 1
        assert failures == {("s0", "http_5xx"): 1}
        assert latencies == {"s1": 2}


async def test_429_re_routes_without_draining() -> None:
    with (
        ScriptedOpenAIServer(replies=[ScriptedReply(status=429, content="busy")]) as s0,
        ScriptedOpenAIServer() as s1,
    ):
        async with ActorPool(config(s0, s1)) as pool:
            g = await pool.generate(
                [{"role": "user", "content": "go"}], max_tokens=4, temperature=0.0, seed=None
            )
            snap = {s.name: s for s in pool.snapshot()}
        assert g.attempts == ["s0", "s1"]
        assert snap["s0"].healthy and snap["s0"].failures == 1 and snap["s0"].dead_since is None
        assert "seed" not in s1.chat_requests[0].json and "stop" not in s1.chat_requests[0].json
