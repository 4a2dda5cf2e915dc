"""The embedded local model end to end: launcher, llama.cpp server, the shipped models
config and the gateway activity, with nothing scripted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from keel.llm import LLMMessage, LLMRequest
from keel.records import LLMCallLog
from services.model_server import LocalModelServer, ModelServerError
from services.processes import free_port
from store.files import load_models_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.embedded_model,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama_cpp is not installed (uv sync --extra local-model)",
    ),
]

SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "models.yaml"


async def test_gateway_gets_json_from_the_local_model(local_model_server: LocalModelServer) -> None:
    from activities.llm import LLMGateway

    # The shipped config, with its port placeholder pointed at this server.
    models = load_models_config(
        SHIPPED, env={"KEEL_MODEL_SERVER_PORT": str(local_model_server.port)}
    )
    assert models.models["local"].api_base == local_model_server.base_url
    logs: list[LLMCallLog] = []

    async def on_call(log: LLMCallLog) -> None:
        logs.append(log)

    gw = LLMGateway(models, on_call=on_call)
    req = LLMRequest(
        messages=[
            LLMMessage(role="system", content="You reply with one short JSON object."),
            LLMMessage(role="user", content='Reply with {"color": "<a color>"}.'),
        ],
        json_mode=True,
        params={"seed": 1},
        timeout_s=120,
    )
    resp = await ActivityEnvironment().run(gw.complete, req)

    parsed = json.loads(resp.content)
    assert isinstance(parsed, dict)
    assert resp.model_name == "local"
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.completion_tokens > 0
    assert resp.cost_usd == 0.0
    assert resp.finish_reason == "stop"  # temperature 0 (config default): no truncated JSON
    assert [(log.status, log.total_tokens > 0) for log in logs] == [("ok", True)]


def test_a_server_that_dies_reports_its_log(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"not gguf")
    server = LocalModelServer(port=free_port(), log_path=tmp_path / "s.log", model_path=bogus)
    with pytest.raises(ModelServerError, match=r"exited with code \d+ during start-up") as info:
        server.start(timeout_s=120)
    assert "last lines of" in str(info.value)
    assert server.pid is None
