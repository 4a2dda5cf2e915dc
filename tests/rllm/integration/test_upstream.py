"""``POST /rllm/runs`` with ``wait`` when the model endpoint is down or refuses the key:
502/503 with the upstream error's code and a retry hint, never 500 (issue 15 §6)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from pydantic import SecretStr

from api.app import create_app
from keel.settings import ApiToken, Settings
from services.processes import free_port
from tests.support.api import auth
from tests.support.rllm import summary_body
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, models_yaml
from workers.main import build_worker


@pytest.fixture
def model_server() -> Iterator[ScriptedOpenAIServer]:
    refusal = ScriptedReply(status=401, content="Incorrect API key provided")
    with ScriptedOpenAIServer(default=refusal) as srv:
        yield srv


async def _http(settings: Settings, client, base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    cfg = settings.data_dir.parent / "models.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(models_yaml(base_url))
    tokens = [ApiToken(token=SecretStr("tok-alice-0123456789"), actor="alice", roles=["requester"])]
    s = settings.model_copy(update={"models_config": cfg, "api_tokens": tokens})
    async with build_worker(client, s):
        app = create_app(s, client=client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://keel.test") as c:
            yield c


async def test_model_endpoint_refusing_the_key_is_502(settings, client, model_server):
    async for http in _http(settings, client, model_server.base_url):
        resp = await http.post("/rllm/runs", json=summary_body(wait=True), headers=auth("alice"))
    assert resp.status_code == 502, resp.text
    err = resp.json()["error"]
    assert err["code"] == "LLMAuthError"
    assert err["details"]["upstream"]["status_code"] == 401
    assert err["details"]["upstream"]["retryable"] is False
    assert err["details"]["error_code"] == "RLLM_INTERNAL_ERROR"  # the run's own payload
    assert "Retry-After" not in resp.headers


async def test_model_endpoint_down_is_503_with_retry_after(settings, client):
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    async for http in _http(settings, client, closed):
        resp = await http.post(
            "/rllm/runs", json=summary_body(wait=True, wait_timeout_s=120), headers=auth("alice")
        )
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert err["code"] == "LLMConnectionError"
    assert err["details"]["upstream"]["retryable"] is True
    assert int(resp.headers["Retry-After"]) > 0
