"""The models config: the shipped file, env expansion, and clear errors on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from keel.llm import (
    LLMMessage,
    LLMRequest,
    ModelNotAllowedError,
    ModelsConfigError,
    UnknownModelError,
)
from keel.settings import Settings
from store.files import load_models_config

SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "models.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "models.yaml"
    p.write_text(text)
    return p


def test_shipped_config_points_at_the_local_server() -> None:
    config = load_models_config(SHIPPED, env={})
    name, spec = config.resolve("")
    assert (name, config.default) == ("local", "local")
    assert spec.litellm_model == "openai/smollm2"
    # Without KEEL_MODEL_SERVER_PORT the URL uses Settings' default port.
    assert (
        spec.api_base == f"http://127.0.0.1:{Settings.model_fields['model_server_port'].default}/v1"
    )
    assert spec.api_key_env is None
    assert (spec.input_cost_per_token, spec.output_cost_per_token) == (0.0, 0.0)
    assert Settings.model_fields["models_config"].default.resolve() == SHIPPED.resolve()


def test_port_follows_the_environment() -> None:
    config = load_models_config(SHIPPED, env={"KEEL_MODEL_SERVER_PORT": "9123"})
    assert config.models["local"].api_base == "http://127.0.0.1:9123/v1"


def test_resolve_unknown_lists_known_names() -> None:
    config = load_models_config(SHIPPED, env={})
    with pytest.raises(UnknownModelError, match=r"'nope'.*known models: local"):
        config.resolve("nope")


def test_resolve_model_strings(tmp_path: Path) -> None:
    """A LiteLLM model string resolves to the entry that serves it, else to itself with
    LiteLLM's defaults (no endpoint, key variable, prices or schema form)."""
    config = load_models_config(SHIPPED, env={})
    assert config.allow is None  # the shipped config allows any model string
    name, spec = config.resolve("openai/smollm2")
    assert (name, spec) == ("local", config.models["local"])
    name, spec = config.resolve("anthropic/claude-sonnet-4-5")
    assert name == "anthropic/claude-sonnet-4-5" and not config.is_configured(name)
    assert (spec.litellm_model, spec.provider) == ("anthropic/claude-sonnet-4-5", "anthropic")
    assert (spec.api_base, spec.api_key_env, spec.input_cost_per_token) == (None, None, None)
    assert spec.structured_output == "none"
    assert config.resolve("hosted_vllm/Qwen/Qwen2.5-7B")[0] == "hosted_vllm/Qwen/Qwen2.5-7B"
    for not_a_string in ("gpt-4o", "Open AI/x", "openai/"):
        with pytest.raises(UnknownModelError, match="provider/model"):
            config.resolve(not_a_string)


def test_allow_list(tmp_path: Path) -> None:
    text = SHIPPED.read_text() + 'allow: ["openai/gpt-4o*", "anthropic/claude-*"]\n'
    config = load_models_config(write(tmp_path, text), env={})
    assert config.allow == ["openai/gpt-4o*", "anthropic/claude-*"]
    assert config.resolve("openai/gpt-4o-mini")[0] == "openai/gpt-4o-mini"
    assert config.resolve("anthropic/claude-sonnet-4-5")[0] == "anthropic/claude-sonnet-4-5"
    with pytest.raises(ModelNotAllowedError) as info:
        config.resolve("openai/o3")
    assert "'openai/o3'" in str(info.value)
    assert "openai/gpt-4o*, anthropic/claude-*" in str(info.value)
    assert (info.value.model, info.value.allow) == ("openai/o3", config.allow)
    # Configured models are always allowed, by name and by the string an entry serves.
    assert config.resolve("local")[0] == config.resolve("openai/smollm2")[0] == "local"
    assert config.resolve("")[0] == "local"
    # An empty list: the configured models only.
    none = load_models_config(write(tmp_path, SHIPPED.read_text() + "allow: []\n"), env={})
    assert none.resolve("openai/smollm2")[0] == "local"
    with pytest.raises(ModelNotAllowedError, match="only the configured models"):
        none.resolve("openai/gpt-4o")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "default: a\nmodels:\n  a: {litellm_model: openai/x}\nallow: ['']\n",
            "allow: Value error, patterns must not be empty",
        ),
        ("default: a\nmodels:\n  a: {litellm_model: openai/x}\nallow: openai/*\n", "allow:"),
        ("default: a\nmodels: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("default: b\nmodels:\n  a: {litellm_model: openai/x}\n", "default 'b' is not one of"),
        (
            "default: a\nmodels:\n  a: {api_base: http://x}\n",
            "models.a.litellm_model: Field required",
        ),
        (
            "default: a\nmodels:\n  a: {litellm_model: openai/x, api_key: sk-live-XYZ}\n",
            "models.a.api_key: Extra inputs are not permitted",
        ),
        (
            "default: a\nmodels:\n  a: {litellm_model: openai/x, api_key_env: sk-live-XYZ}\n",
            "models.a.api_key_env: Value error, must be the name of an environment variable",
        ),
        (
            "default: a\nmodels:\n  a: {litellm_model: openai/x, params: {num_retries: 3}}\n",
            "models.a.params: Value error, params may not set num_retries",
        ),
        (
            "default: a\nmodels:\n  a: {litellm_model: openai/x, api_base: 'http://h:${KEEL_NOPE}/v1'}\n",
            "models.a.api_base: environment variable KEEL_NOPE is not set",
        ),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ModelsConfigError) as info:
        load_models_config(path, env={})
    message = str(info.value)
    assert str(path) in message
    assert expected in message
    assert "sk-live-XYZ" not in message  # a misplaced key is never repeated


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelsConfigError, match="cannot read models config"):
        load_models_config(tmp_path / "absent.yaml")


def test_request_rejects_reserved_params() -> None:
    with pytest.raises(ValidationError, match="api_key"):
        LLMRequest(messages=[LLMMessage(role="user", content="x")], params={"api_key": "k"})
