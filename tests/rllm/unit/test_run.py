"""The run contract's pure helpers: file bundles, input decoding, model names, and the
``llm_params`` check against LiteLLM's lists (LiteLLM is real, nothing is stubbed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.llm import load_litellm, qualify_model
from activities.rllm import bundle_loader, load_resolved, param_issues, parsed
from keel.llm import ModelsConfig, ModelSpec
from keel.rllm.errors import DependencyResolutionError, MetadataValidationError, ParseError
from keel.rllm.model import LLMSpec
from keel.rllm.run import (
    RllmRunInput,
    decode_input,
    resolve_model_name,
    workflow_id_for,
)
from store.files import bundle_files, load_rllm

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MODELS = ModelsConfig(
    default="local",
    models={
        "local": ModelSpec(litellm_model="openai/smollm2", api_base="http://127.0.0.1:1/v1"),
        "qwen": ModelSpec(litellm_model="hosted_vllm/Qwen/Qwen2.5-7B-Instruct"),
        "ollama-small": ModelSpec(litellm_model="ollama/smollm2:135m"),
    },
)


def test_bundle_files_reads_the_root_and_every_used_file(tmp_path: Path) -> None:
    files = bundle_files(EXAMPLES / "compose_summary_keywords.rllm")
    assert sorted(files) == [
        "compose_summary_keywords.rllm",
        "extract_keywords.rllm",
        "summary.rllm",
    ]
    assert files["summary.rllm"] == (EXAMPLES / "summary.rllm").read_text()
    # The bundle resolves exactly as the files on disk do.
    from_bundle = load_resolved("compose_summary_keywords.rllm", files)
    from_disk = load_resolved(str(EXAMPLES / "compose_summary_keywords.rllm"), {})
    assert from_bundle.graph.digest() == from_disk.graph.digest()
    assert from_bundle.graph.order() == from_disk.graph.order()


def test_bundle_files_subdirectories_cycles_and_escapes(tmp_path: Path) -> None:
    head = (EXAMPLES / "summary.rllm").read_text().split("---\n")[1]
    (tmp_path / "lib").mkdir()
    (tmp_path / "a.rllm").write_text(f"---\n{head}uses:\n  - path: lib/b.rllm\n---\nx\n")
    (tmp_path / "lib" / "b.rllm").write_text(f"---\n{head}uses:\n  - path: ../a.rllm\n---\nx\n")
    assert sorted(bundle_files(tmp_path / "a.rllm")) == ["a.rllm", "lib/b.rllm"]
    (tmp_path / "lib" / "b.rllm").write_text(f"---\n{head}uses:\n  - path: ../../x.rllm\n---\n")
    with pytest.raises(DependencyResolutionError, match="outside"):
        bundle_files(tmp_path / "a.rllm")
    (tmp_path / "lib" / "b.rllm").write_text(f"---\n{head}uses:\n  - path: gone.rllm\n---\n")
    with pytest.raises(DependencyResolutionError, match="cannot read"):
        bundle_files(tmp_path / "a.rllm")
    with pytest.raises(ParseError):
        bundle_files(tmp_path / "missing.rllm")


def test_bundle_loader_names_missing_files() -> None:
    with pytest.raises(ParseError, match="not in the files sent"):
        bundle_loader({"a.rllm": ""})(Path("lib/b.rllm"))
    with pytest.raises(ParseError, match="relative path"):
        load_resolved("../a.rllm", {"a.rllm": ""})


def test_a_bundled_file_is_parsed_once_and_each_caller_gets_its_own_copy() -> None:
    text = (EXAMPLES / "summary.rllm").read_text()
    first, again = parsed(text, "summary.rllm"), parsed(text, "summary.rllm")
    assert first == again and first is not again
    first.name = "changed"
    assert parsed(text, "summary.rllm").name == again.name != "changed"
    # A file that does not parse raises every time (errors are not kept).
    for _ in range(2):
        with pytest.raises(ParseError):
            parsed("no frontmatter", "bad.rllm")


def test_decode_input() -> None:
    summary = load_rllm(EXAMPLES / "summary.rllm")
    assert decode_input(summary, {"text": "t"}) == {"text": "t"}
    assert decode_input(summary, '{"text": "t", "max_sentences": 3}') == {
        "text": "t",
        "max_sentences": 3,
    }
    assert decode_input(summary, "text: t\nmax_sentences: 3\n") == {"text": "t", "max_sentences": 3}
    # Prose that happens to be YAML stays prose: its key is not an input.
    assert decode_input(summary, "Note: this is text") == {"text": "Note: this is text"}
    assert decode_input(summary, "{not json") == {"text": "{not json"}
    assert decode_input(summary, 5) == 5


def test_resolve_model_name() -> None:
    keel = LLMSpec(provider="keel", model="local")
    assert resolve_model_name(keel, None, MODELS) == "local"
    assert resolve_model_name(keel, "qwen", MODELS) == "qwen"
    direct = LLMSpec.from_string("hosted_vllm/Qwen/Qwen2.5-7B-Instruct")
    assert resolve_model_name(direct, None, MODELS) == "qwen"
    # A LiteLLM model string no entry serves runs as itself (LiteLLM's defaults).
    gpt = LLMSpec.from_string("openai/gpt-4o")
    assert resolve_model_name(gpt, None, MODELS) == "openai/gpt-4o"
    assert resolve_model_name(keel, "anthropic/claude-sonnet-4-5", MODELS) == (
        "anthropic/claude-sonnet-4-5"
    )
    # ... and the override may name one an entry serves: the entry's name.
    assert resolve_model_name(keel, "hosted_vllm/Qwen/Qwen2.5-7B-Instruct", MODELS) == "qwen"
    with pytest.raises(MetadataValidationError, match="nor a LiteLLM model string") as info:
        resolve_model_name(keel, "nope", MODELS)
    assert info.value.details["known"] == ["local", "ollama-small", "qwen"]
    # A bare name becomes a model string where the worker's LiteLLM knows it.
    assert resolve_model_name(keel, "gpt-4o", MODELS, qualify=qualify_model) == "openai/gpt-4o"
    with pytest.raises(MetadataValidationError):
        resolve_model_name(keel, "gpt-99", MODELS, qualify=qualify_model)
    with pytest.raises(MetadataValidationError, match=r"llm\.model 'other'"):
        resolve_model_name(LLMSpec(provider="keel", model="other"), None, MODELS)


def test_resolve_model_name_enforces_the_allow_list() -> None:
    only = MODELS.model_copy(update={"allow": ["anthropic/claude-*"]})
    claude = LLMSpec.from_string("anthropic/claude-sonnet-4-5")
    assert resolve_model_name(claude, None, only) == "anthropic/claude-sonnet-4-5"
    with pytest.raises(MetadataValidationError, match="not allowed") as info:
        resolve_model_name(LLMSpec.from_string("openai/gpt-4o"), None, only)
    assert info.value.details["allow"] == ["anthropic/claude-*"]
    assert "'openai/gpt-4o'" in info.value.message and "anthropic/claude-*" in info.value.message
    with pytest.raises(MetadataValidationError, match="not allowed"):
        resolve_model_name(claude, "openai/gpt-4o", only)
    # Configured models stay allowed, by name or by the string an entry serves; an empty
    # list allows only them.
    none = MODELS.model_copy(update={"allow": []})
    assert resolve_model_name(LLMSpec(provider="keel", model="local"), None, none) == "local"
    qwen = LLMSpec.from_string("hosted_vllm/Qwen/Qwen2.5-7B-Instruct")
    assert resolve_model_name(qwen, None, none) == "qwen"
    with pytest.raises(MetadataValidationError, match="only the configured models"):
        resolve_model_name(claude, None, none)


def test_llm_params_against_litellm_lists() -> None:
    litellm = load_litellm()
    program = load_rllm(
        EXAMPLES / "extract_keywords.rllm"
    )  # temperature, max_tokens, penalty, seed

    def supported(model: str) -> list[str] | None:
        m, provider, _, _ = litellm.get_llm_provider(model)
        return litellm.get_supported_openai_params(model=m, custom_llm_provider=provider)

    assert param_issues(program, supported("openai/smollm2"), "openai/smollm2") == []
    assert param_issues(program, supported("ollama/smollm2:135m"), "ollama/smollm2:135m") == []
    # Anthropic takes neither frequency_penalty nor seed.
    issues = param_issues(
        program, supported("anthropic/claude-sonnet-4-5"), "anthropic/claude-sonnet-4-5"
    )
    assert [i["path"] for i in issues] == ["$.frequency_penalty", "$.seed"]
    assert param_issues(program, None, "nosuch/x")[0]["path"] == "$"


def test_run_input_contract() -> None:
    inp = RllmRunInput.model_validate({"path": "a.rllm", "input": "hello"})
    assert (inp.max_retries, inp.record_stats, inp.files, inp.model) == (None, True, {}, None)
    with pytest.raises(ValueError):
        RllmRunInput(path="a.rllm", max_retries=-1)
    with pytest.raises(ValueError):
        RllmRunInput.model_validate({"path": "a.rllm", "unknown": 1})
    assert workflow_id_for("summary", "u1") == "rllm/summary/u1"
