"""keel.srl.actors: the actors config, its errors, and the ``vllm serve`` command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.actors import parse_chat_response
from keel.srl.actors import (
    ActorEndpoint,
    parse_actors_config,
    shell_line,
    vllm_command,
    vllm_env,
)
from keel.srl.errors import ActorsConfigError
from store.files import load_actors_config

ROOT = Path(__file__).resolve().parents[3]

ONE = """
endpoints:
  - name: a
    base_url: http://127.0.0.1:8001/v1
    port: 8001
    model: Qwen/Qwen3-14B
"""


def endpoint(**kw: object) -> ActorEndpoint:
    base: dict[str, object] = {
        "name": "a",
        "base_url": "http://127.0.0.1:8001/v1",
        "port": 8001,
        "model": "Qwen/Qwen3-14B",
    }
    return ActorEndpoint.model_validate({**base, **kw})


def test_minimal_config_takes_the_documented_defaults() -> None:
    cfg = parse_actors_config(ONE)
    assert (cfg.health_interval_s, cfg.retry_dead_after_s, cfg.request_timeout_s) == (15, 60, 120)
    (e,) = cfg.endpoints
    assert (e.gpu, e.quantization, e.tensor_parallel_size, e.bind_host) == (
        None,
        None,
        1,
        "127.0.0.1",
    )
    assert e.root_url == "http://127.0.0.1:8001"


def test_production_example_is_three_gpus_on_8001_to_8003() -> None:
    cfg = load_actors_config(ROOT / "configs" / "vllm_actors.yaml")
    assert [(e.gpu, e.port, e.tensor_parallel_size) for e in cfg.endpoints] == [
        (0, 8001, 1),
        (1, 8002, 1),
        (2, 8003, 1),
    ]
    assert {e.model for e in cfg.endpoints} == {"Qwen/Qwen3-14B"}
    assert {e.quantization for e in cfg.endpoints} == {"bitsandbytes"}
    assert cfg.health_interval_s == 15


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("endpoints: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("endpoints: []", "endpoints: List should have at least 1 item"),
        (ONE + "extra_key: 1\n", "extra_key: Extra inputs are not permitted"),
        (ONE.replace("port: 8001", "port: 8002"), "base_url port 8001 differs from port 8002"),
        (ONE.replace("/v1", "/v2"), "endpoints.0.base_url: Value error, must end in /v1"),
        (ONE.replace("http://", "ftp://"), "endpoints.0.base_url: Value error, must be an http(s)"),
        (ONE.replace("/v1", "/v1?key=x"), "endpoints.0.base_url: Value error, must be an http(s)"),
        (ONE.replace("name: a", "name: 'a b'"), "endpoints.0.name: String should match pattern"),
        (ONE.replace("port: 8001", "port: 8001\n    gpu: -1"), "endpoints.0.gpu"),
        (ONE + "health_interval_s: 0\n", "health_interval_s: Input should be greater than 0"),
        (
            ONE.replace("port: 8001", "port: 8001\n    extra_args: ['--port=9000']"),
            "endpoints.0.extra_args: Value error, --port is set from the endpoint's own fields",
        ),
        (
            ONE.replace("port: 8001", "port: 8001\n    quantization: 'bitsandbytes 4bit'"),
            "endpoints.0.quantization: String should match pattern",
        ),
    ],
)
def test_config_errors_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ActorsConfigError) as err:
        parse_actors_config(text, "cfg.yaml")
    message = str(err.value)
    assert message.startswith("cfg.yaml: ")
    assert needle in message


def test_duplicates_and_shared_gpus_are_refused_together() -> None:
    text = """
endpoints:
  - {name: a, base_url: http://h:8001/v1, port: 8001, model: m, gpu: 0, tensor_parallel_size: 2}
  - {name: a, base_url: http://h:8001/v1, port: 8001, model: m, gpu: 1}
"""
    with pytest.raises(ActorsConfigError) as err:
        parse_actors_config(text)
    message = str(err.value)
    assert "two endpoints have name 'a'" in message
    assert "two endpoints have base_url 'http://h:8001/v1'" in message
    assert "GPU 1 is given to both 'a' and 'a'" in message


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ActorsConfigError, match=r"nope\.yaml: cannot read actors config"):
        load_actors_config(missing)


def test_vllm_command_and_env() -> None:
    e = endpoint(
        gpu=2,
        quantization="bitsandbytes",
        max_model_len=8192,
        extra_args=["--gpu-memory-utilization", "0.9"],
    )
    assert vllm_command(e) == [
        "vllm", "serve", "Qwen/Qwen3-14B",
        "--host", "127.0.0.1",
        "--port", "8001",
        "--tensor-parallel-size", "1",
        "--quantization", "bitsandbytes",
        "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip
    assert vllm_env(e) == {"CUDA_VISIBLE_DEVICES": "2"}
    assert shell_line(e, "/opt/v/bin/vllm").startswith(
        "CUDA_VISIBLE_DEVICES=2 /opt/v/bin/vllm serve Qwen/Qwen3-14B --host 127.0.0.1"
    )


def test_tensor_parallel_takes_consecutive_gpus_and_no_gpu_means_no_env() -> None:
    e = endpoint(gpu=4, tensor_parallel_size=2, bind_host="0.0.0.0")
    argv = vllm_command(e)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "--quantization" not in argv and "--max-model-len" not in argv
    assert vllm_env(e) == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert vllm_env(endpoint()) == {}
    assert shell_line(endpoint(extra_args=["--chat-template", "a b.jinja"])).endswith(
        "--chat-template 'a b.jinja'"
    )


# -- answers: what each server puts where -------------------------------------------------


def test_llama_cpp_answer_has_logprobs_but_no_token_ids() -> None:
    # The shape llama-cpp-python 0.3.36 returns for logprobs=true, top_logprobs=1.
    body = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "Hello there"},
                "logprobs": {
                    "content": [
                        {"token": "Hello", "logprob": -1.07, "bytes": None, "top_logprobs": []},
                        {"token": " there", "logprob": -0.81, "bytes": None, "top_logprobs": []},
                    ]
                },
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 2},
    }
    text, extras = parse_chat_response(body)
    assert text == "Hello there"
    assert extras == {
        "token_ids": None,
        "logprobs": [-1.07, -0.81],
        "prompt_tokens": 31,
        "completion_tokens": 2,
        "finish_reason": "length",
    }


def test_vllm_token_ids_from_the_choice_or_from_token_id_tokens() -> None:
    lp = {
        "content": [
            {"token": "token_id:9707", "logprob": -0.5},
            {"token": "token_id:11", "logprob": 0.0},
        ]
    }
    with_ids = {
        "choices": [{"message": {"content": "Hi,"}, "logprobs": lp, "token_ids": [9707, 11]}]
    }
    only_tokens = {"choices": [{"message": {"content": "Hi,"}, "logprobs": lp}]}
    for body in (with_ids, only_tokens):
        _, extras = parse_chat_response(body)
        assert extras["token_ids"] == [9707, 11]
        assert extras["logprobs"] == [-0.5, 0.0]
        assert extras["prompt_tokens"] is None


@pytest.mark.parametrize(
    "body",
    [[], {}, {"choices": []}, {"choices": [{"message": {"content": 3}}]}, {"choices": ["x"]}],
)
def test_an_answer_that_is_not_a_chat_completion_is_a_value_error(body: object) -> None:
    with pytest.raises(ValueError):
        parse_chat_response(body)
