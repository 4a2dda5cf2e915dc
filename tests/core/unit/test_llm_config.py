"""The models config: the shipped file, env expansion, and clear errors on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from keel.llm import (
    LLMMessage,
    LLMRequest,
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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
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
