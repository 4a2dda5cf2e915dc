"""Codegen: the template renderer is deterministic and complete; providers check paths."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.design.codegen import (
    AnthropicProvider,
    CodeGenError,
    LiteLLMProvider,
    check_paths,
    parse_file_map,
    render_request,
)
from activities.llm import LLMGateway
from keel.design.reasons import rationale_json
from keel.llm import ModelsConfig, ModelSpec
from keel.records import LLMCallLog
from tests.design.codegen_cases import CASES, request_for
from tests.support.scripted_anthropic import ScriptedAnthropicServer
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply


@pytest.mark.parametrize("case", CASES)
def test_same_input_same_bytes(case: str) -> None:
    first = render_request(request_for(case))
    second = render_request(request_for(case))
    assert list(first) == sorted(first)
    assert json.dumps(first, sort_keys=True).encode() == json.dumps(second, sort_keys=True).encode()


@pytest.mark.parametrize("case", CASES)
def test_every_capability_and_report_present(case: str) -> None:
    req = request_for(case)
    files = render_request(req)
    assert len(req.plan.choices) == 8
    for choice in req.plan.choices:
        tf = files[f"infra/modules/{choice.capability.value}/main.tf"]
        assert choice.pattern_id in tf
    for path in (
        "services/serve/app.py",
        "tests/test_serve.py",
        "README.md",
        ".github/workflows/ci.yml",
        "reports/cost.json",
        "reports/policy.json",
    ):
        assert path in files, path
    assert json.loads(files["reports/rationale.json"]) == json.loads(
        json.dumps(rationale_json(req.reason_cards))
    )
    assert json.loads(files["reports/cost.json"])["monthly_usd"] == req.cost.monthly_usd
    assert "## Design Rationale" in files["README.md"]
    for path in files:
        assert not path.startswith("/") and ".." not in path.split("/")


def test_dockerfiles_follow_the_deployment() -> None:
    """Serving and training always ship an image (ECS task, Lambda image or SageMaker
    container); any other image only when the Terraform runs it (no plan's ingest does:
    MSK's consumer is the transform Lambda)."""
    req = request_for("batch_training")
    files = render_request(req)
    assert "services/serve/Dockerfile" in files and "services/train/Dockerfile" in files
    assert "services/ingest/Dockerfile" not in files  # ingest:s3-batch is serverless
    assert "Dockerfile" not in files  # one per service, none at the root
    streaming = render_request(request_for("streaming_features"))
    assert "services/ingest/Dockerfile" not in streaming  # MSK: consumed by a Lambda
    cat = req.catalog
    assert cat is not None
    no_containers = req.model_copy(
        update={
            "plan": req.plan.model_copy(
                update={
                    "choices": [
                        c
                        for c in req.plan.choices
                        if cat.by_id()[c.pattern_id].deployment.value != "containers"
                    ]
                }
            )
        }
    )
    assert sorted(p for p in render_request(no_containers) if p.endswith("Dockerfile")) == [
        "services/serve/Dockerfile"
    ]


def test_online_serving_exposes_predict_and_rag_retrieve() -> None:
    online = render_request(request_for("online_serving_slo"))["services/serve/app.py"]
    assert '@app.post("/predict")' in online and "LATENCY_SLO_MS: int | None = 100" in online
    rag = render_request(request_for("rag"))["services/serve/app.py"]
    assert '@app.post("/retrieve")' in rag
    batch = render_request(request_for("batch_training"))["services/serve/app.py"]
    assert '@app.post("/score-batch")' in batch


@pytest.mark.parametrize(
    "bad",
    ["/etc/passwd", "../up.py", "a/../../b", "a\\b", "", "a//b", "./a", "dir/", "a\x00b"],
)
def test_bad_paths_refused(bad: str) -> None:
    with pytest.raises(CodeGenError):
        check_paths({bad: "x", "ok.py": ""})


def test_parse_file_map_shapes() -> None:
    assert parse_file_map('```json\n{"b.py": "", "a.py": "x"}\n```') == {"a.py": "x", "b.py": ""}
    assert parse_file_map('{"files": {"a.py": "x"}}') == {"a.py": "x"}
    for bad in ("not json", "[]", "{}", '{"a.py": 1}', '{"../a.py": "x"}'):
        with pytest.raises(CodeGenError):
            parse_file_map(bad)


def test_anthropic_provider_against_scripted_server() -> None:
    answer = json.dumps({"services/app.py": "x = 1\n", "README.md": "# r\n"})
    req = request_for("rag")

    async def go(base_url: str) -> dict[str, str]:
        provider = AnthropicProvider(api_key="test-key", base_url=base_url, model="claude-test")
        try:
            return await provider.generate(req)
        finally:
            await provider.aclose()

    with ScriptedAnthropicServer([answer]) as srv:
        files = asyncio.run(go(srv.base_url))
    assert files == {"README.md": "# r\n", "services/app.py": "x = 1\n"}
    assert len(srv.requests) == 1
    sent = srv.requests[0]
    assert sent["model"] == "claude-test"
    assert sent["messages"][0]["role"] == "user"
    assert '"serve": "serve:lambda-serverless"' in sent["messages"][0]["content"]
    auth = srv.headers[0].get("x-api-key") or srv.headers[0].get("authorization", "")
    assert auth.endswith("test-key")
    assert "anthropic-version" in srv.headers[0]


def test_anthropic_provider_refuses_escaping_paths_and_cut_answers() -> None:
    req = request_for("rag")

    async def go(base_url: str) -> dict[str, str]:
        provider = AnthropicProvider(api_key="k", base_url=base_url)
        try:
            return await provider.generate(req)
        finally:
            await provider.aclose()

    escaping = json.dumps({"../../etc/cron.d/x": "boom"})
    with (
        ScriptedAnthropicServer([escaping]) as srv,
        pytest.raises(CodeGenError, match="not allowed"),
    ):
        asyncio.run(go(srv.base_url))
    with (
        ScriptedAnthropicServer(['{"a.py": "x"'], stop_reason="max_tokens") as srv,
        pytest.raises(CodeGenError, match="max_tokens"),
    ):
        asyncio.run(go(srv.base_url))


def test_litellm_provider_through_the_gateway() -> None:
    answer = json.dumps({"services/app.py": "x = 1\n", "tests/test_app.py": "def test_x(): ...\n"})
    logs: list[LLMCallLog] = []

    async def on_call(log: LLMCallLog) -> None:
        logs.append(log)

    with ScriptedOpenAIServer([ScriptedReply(content=answer)]) as srv:
        gateway = LLMGateway(
            ModelsConfig(
                default="scripted",
                models={
                    "scripted": ModelSpec(litellm_model="openai/scripted", api_base=srv.base_url)
                },
            ),
            on_call=on_call,
        )
        provider = LiteLLMProvider(gateway, call_key="test/codegen/1", workflow_id="design/p/ds")
        files = asyncio.run(provider.generate(request_for("streaming_features")))
        sent = srv.requests[0].json
    assert files == {"services/app.py": "x = 1\n", "tests/test_app.py": "def test_x(): ...\n"}
    assert sent is not None
    assert sent["response_format"]["type"] == "json_object"
    assert sent["messages"][0]["role"] == "system"
    assert '"ingest": "ingest:msk-kafka"' in sent["messages"][1]["content"]
    assert [entry.call_key for entry in logs] == ["test/codegen/1"]


def test_litellm_provider_refuses_a_bad_answer() -> None:
    with ScriptedOpenAIServer([ScriptedReply(content='{"/abs.py": "x"}')]) as srv:
        gateway = LLMGateway(
            ModelsConfig(
                default="scripted",
                models={
                    "scripted": ModelSpec(litellm_model="openai/scripted", api_base=srv.base_url)
                },
            )
        )
        with pytest.raises(CodeGenError, match="not a relative path"):
            asyncio.run(LiteLLMProvider(gateway).generate(request_for("rag")))


_DIGEST_SCRIPT = """
import hashlib, json
from activities.design.codegen import render_request
from tests.design.codegen_cases import CASES, request_for
blob = json.dumps([render_request(request_for(c)) for c in CASES], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_same_bytes_across_processes_and_hash_seeds() -> None:
    root = Path(__file__).resolve().parents[3]
    digests = set()
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST_SCRIPT],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(next(iter(digests))) == 64
