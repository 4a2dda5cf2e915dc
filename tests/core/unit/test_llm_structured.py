"""The gateway's structured-output path: one request field (``json_schema``), sent in the
form the model's server takes (``ModelSpec.structured_output``), through real LiteLLM to a
real scripted HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.llm import LLMGateway
from keel.llm import (
    LLMMessage,
    LLMRequest,
    ModelsConfig,
    ModelsConfigError,
    ModelSpec,
    parse_models_config,
    response_format,
)
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
}


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


def gateway(base_url: str, form: str) -> LLMGateway:
    spec = ModelSpec(litellm_model="openai/scripted", api_base=base_url, structured_output=form)  # type: ignore[arg-type]
    return LLMGateway(ModelsConfig(default="m", models={"m": spec}))


def request(**kw: Any) -> LLMRequest:
    return LLMRequest(messages=[LLMMessage(role="user", content="hi")], **kw)


@pytest.mark.parametrize(
    ("form", "sent"),
    [
        (
            "json_schema",
            {"type": "json_schema", "json_schema": {"name": "srl_step", "schema": SCHEMA}},
        ),
        ("json_object_schema", {"type": "json_object", "schema": SCHEMA}),
        ("none", {"type": "json_object"}),
    ],
)
async def test_the_schema_goes_in_the_servers_form(
    server: ScriptedOpenAIServer, form: str, sent: dict[str, Any]
) -> None:
    server.enqueue(ScriptedReply(content='{"answer": 1}'))
    resp = await ActivityEnvironment().run(
        gateway(server.base_url, form).complete,
        request(json_mode=True, json_schema=SCHEMA, schema_name="srl_step"),
    )
    [req] = server.chat_requests
    assert req.json is not None and req.json["response_format"] == sent
    assert resp.structured == form
    assert resp.content == '{"answer": 1}'


async def test_a_schema_without_json_mode_still_constrains_where_the_server_can(
    server: ScriptedOpenAIServer,
) -> None:
    await ActivityEnvironment().run(
        gateway(server.base_url, "json_object_schema").complete, request(json_schema=SCHEMA)
    )
    await ActivityEnvironment().run(
        gateway(server.base_url, "none").complete, request(json_schema=SCHEMA)
    )
    first, second = server.chat_requests
    assert first.json is not None and first.json["response_format"]["schema"] == SCHEMA
    # A server that cannot be asked gets no response_format at all: the caller recovers.
    assert second.json is not None and "response_format" not in second.json


async def test_no_schema_no_json_mode_sends_no_response_format(
    server: ScriptedOpenAIServer,
) -> None:
    resp = await ActivityEnvironment().run(
        gateway(server.base_url, "json_schema").complete, request()
    )
    [req] = server.chat_requests
    assert req.json is not None and "response_format" not in req.json
    assert resp.structured == "none"


def test_response_format_is_pure_and_total() -> None:
    for form in ("json_schema", "json_object_schema", "none"):
        for json_mode in (False, True):
            for schema in (None, SCHEMA):
                fmt, used = response_format(form, json_mode=json_mode, schema=schema, name="n")  # type: ignore[arg-type]
                assert (used != "none") == (schema is not None and form != "none")
                assert (fmt is None) == (not json_mode and used == "none")


def test_the_config_names_the_form_and_refuses_others() -> None:
    text = (
        "default: a\nmodels:\n  a:\n    litellm_model: openai/x\n"
        "    structured_output: json_schema\n"
    )
    assert parse_models_config(text, "m.yaml", {}).models["a"].structured_output == "json_schema"
    with pytest.raises(ModelsConfigError, match="structured_output"):
        parse_models_config(text.replace("json_schema", "grammar"), "m.yaml", {})
    plain = "default: a\nmodels:\n  a:\n    litellm_model: openai/x\n"
    assert parse_models_config(plain, "m.yaml", {}).models["a"].structured_output == "none"


def test_the_shipped_config_asks_the_embedded_server_in_llama_cpps_form() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "configs" / "models.yaml").read_text()
    config = parse_models_config(text, "configs/models.yaml", {})
    assert config.models["local"].structured_output == "json_object_schema"
