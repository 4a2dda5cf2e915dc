"""Golden error payloads: every broken sample file, composition failure and run-time error.

The JSON files under tests/rllm/unit/rllm_golden/ are the exact payloads users and calling
models see. To regenerate them after an intended change, run
``KEEL_UPDATE_GOLDEN=1 uv run pytest tests/rllm/unit/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.rllm import (
    RllmError,
    check_context_window,
    check_output,
    parse_output,
    retry_exhausted,
    validate_input,
)
from keel.rllm.errors import ERROR_CLASSES
from store.files import load_rllm, load_rllm_app

GOLDEN = Path(__file__).parent / "rllm_golden"
EXAMPLES = Path(__file__).parents[3] / "examples"
UPDATE = os.environ.get("KEEL_UPDATE_GOLDEN") == "1"

BROKEN = sorted(p.stem for p in (GOLDEN / "broken").glob("*.rllm"))
COMPOSE_FAILURES = [
    "broken_child",
    "cycle_a",
    "exposes_unknown",
    "missing_child",
    "optional_to_required",
    "output_map_mismatch",
    "type_mismatch",
    "unmapped_input",
]


def payload_of(fn: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(RllmError) as info:
        fn()
    return info.value.to_payload().model_dump(mode="json")


def assert_golden(relpath: str, payload: dict[str, Any]) -> None:
    path = GOLDEN / relpath
    if UPDATE:
        path.write_text(json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    assert path.exists(), f"no golden {relpath}; run with KEEL_UPDATE_GOLDEN=1 and review it"
    assert payload == json.loads(path.read_text())


@pytest.mark.parametrize("name", BROKEN)
def test_broken_file_payload(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN)
    payload = payload_of(lambda: load_rllm(f"broken/{name}.rllm"))
    assert_golden(f"broken/{name}.json", payload)


@pytest.mark.parametrize("name", COMPOSE_FAILURES)
def test_composition_failure_payload(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN / "compose")
    payload = payload_of(lambda: load_rllm_app(f"{name}.rllm"))
    assert payload["error_type"] == "DependencyResolutionError"
    assert_golden(f"compose/{name}.json", payload)


@pytest.mark.parametrize("name", ["summary", "extract_keywords", "compose_summary_keywords"])
def test_example_parse_tree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsed form of each example, so a parser change shows up as a reviewable diff."""
    monkeypatch.chdir(EXAMPLES)
    program = load_rllm(f"{name}.rllm").model_dump(mode="json", exclude={"source_digest"})
    assert_golden(f"programs/{name}.json", program)


def test_runtime_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES)
    summary = load_rllm("summary.rllm")
    assert_golden(
        "runtime/input_schema.json",
        payload_of(lambda: validate_input(summary, {"text": "", "max_sentences": 9, "x": 1})),
    )
    bad_answer = 'Sure! {"summary": "Cats sit.", "sentences": "one"}'
    assert_golden(
        "runtime/output_schema.json",
        payload_of(lambda: parse_output(bad_answer, summary.output_schema)),
    )
    assert_golden(
        "runtime/context_window.json",
        payload_of(lambda: check_context_window("word " * 2000, 2048, 200)),
    )
    attempts = [
        check_output("I think the summary is: cats.", summary.output_schema),
        check_output('{"summary": "Cats."}', summary.output_schema),
        check_output('{"summary": "Cats.", "sentences": 0}', summary.output_schema),
    ]

    def exhausted() -> None:
        raise retry_exhausted(attempts, summary.output_schema, max_retries=2)

    assert_golden("runtime/retry_exhausted.json", payload_of(exhausted))


def test_golden_files_cover_every_file_error_class() -> None:
    """The goldens exercise each class that loading and running can raise."""
    seen = {
        json.loads(p.read_text())["error_type"]
        for p in GOLDEN.glob("**/*.json")
        if p.parent.name != "programs"
    }
    runtime_only = {"PythonBlockExecutionError", "OllamaModelMissingError"}
    assert {c.__name__ for c in ERROR_CLASSES} - runtime_only <= seen


def test_no_golden_without_a_case() -> None:
    """A stale golden (its sample file deleted) fails instead of lingering."""
    for p in (GOLDEN / "broken").glob("*.json"):
        assert (p.with_suffix(".rllm")).exists(), p
    for p in (GOLDEN / "compose").glob("*.json"):
        assert p.stem in COMPOSE_FAILURES, p
    for p in (GOLDEN / "programs").glob("*.json"):
        assert (EXAMPLES / f"{p.stem}.rllm").exists(), p
