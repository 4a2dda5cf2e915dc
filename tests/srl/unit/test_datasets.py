"""keel.srl.datasets: mappers, manifest, _meta.json, dedup, token filter, split, stats."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from keel.srl.datasets import (
    CANDIDATE_FIELDS,
    MAPPERS,
    DatasetMeta,
    Manifest,
    ManifestEntry,
    NormalizedRecord,
    assign_split,
    check_manifest,
    dedupe,
    filter_tokens,
    flag_parse,
    language_from_extension,
    normalise_lines,
    normalise_rows,
    split_by_language,
    stats_report,
)
from keel.srl.errors import MalformedRecord, ManifestMismatch
from keel.srl.state import heuristic_count_tokens

# Field names as on the CommitPackFT card's "Data Instances" example.
COMMITPACKFT_ROW = {
    "commit": "0c17311f7fd511f5dae8f8e4acc2dce1a2de3cf5",
    "old_file": "main.py",
    "new_file": "main.py",
    "old_contents": "x = np.linspace(-5, 5, 20)\n",
    "new_contents": "x = np.linspace(-math.pi, math.pi, 30)\n",
    "subject": "Change to sin() function with noise",
    "message": "Change to sin() function with noise\n",
    "lang": "Python",
    "license": "mit",
    "repos": "MorganR/basic-gaussian-process",
}


def test_commitpackft_maps_published_fields() -> None:
    rec = MAPPERS["commitpackft"](COMMITPACKFT_ROW, 1)
    assert rec == NormalizedRecord(
        instruction="Change to sin() function with noise",
        pre="x = np.linspace(-5, 5, 20)\n",
        post="x = np.linspace(-math.pi, math.pi, 30)\n",
        language="python",
        tags=["commitpackft", "license:mit"],
    )


def test_editpackft_prefers_its_instruction() -> None:
    row = {
        **COMMITPACKFT_ROW,
        "new_file": "src/app.ts",
        "instruction": "Use pi for the range",
        "ndiff": "…",
        "content": "…",
    }
    rec = MAPPERS["editpackft"](row, 4)
    assert rec.instruction == "Use pi for the range"
    assert rec.language == "typescript"
    no_instruction = MAPPERS["editpackft"]({**row, "instruction": ""}, 5)
    assert no_instruction.instruction == COMMITPACKFT_ROW["subject"]


@pytest.mark.parametrize("dataset", ["ocedataft", "agentpack", "marv", "smellycode"])
def test_candidate_mappers_take_the_first_present_field(dataset: str) -> None:
    fields = CANDIDATE_FIELDS[dataset]
    row = {
        fields["instruction"][-1]: "Long Method",
        fields["pre"][-1]: "class A {}\n",
        fields["post"][-1]: "class B {}\n",
        fields["path"][0]: "src/A.java",
    }
    rec = MAPPERS[dataset](row, 2)
    assert rec.pre == "class A {}\n" and rec.post == "class B {}\n"
    assert rec.language == "java"
    assert rec.instruction.endswith("Long Method")
    assert rec.tags == [dataset]
    with pytest.raises(MalformedRecord) as err:
        MAPPERS[dataset]({k: v for k, v in row.items() if k != fields["pre"][-1]}, 9)
    assert err.value.line == 9
    assert fields["pre"][0] in err.value.field


def test_normalise_lines_reports_every_malformed_line() -> None:
    lines = [
        json.dumps(COMMITPACKFT_ROW),
        "",
        "{not json",
        json.dumps([1, 2]),
        json.dumps({**COMMITPACKFT_ROW, "old_contents": None}),
        json.dumps({**COMMITPACKFT_ROW, "new_contents": COMMITPACKFT_ROW["old_contents"]}),
        json.dumps({**COMMITPACKFT_ROW, "new_file": "README", "lang": ""}),
        json.dumps({**COMMITPACKFT_ROW, "new_file": "x.go", "lang": "Go"}),
    ]
    result = normalise_lines("commitpackft", lines)
    assert [r.language for r in result.records] == ["python", "go"]
    assert [(e.line, e.field) for e in result.errors] == [
        (3, "<json>"),
        (4, "<json>"),
        (5, "old_contents"),
        (6, "post"),
        (7, "language"),
    ]
    assert "line 5: old_contents: expected a string, got missing" in result.errors[2].render()
    # The result is plain data an activity can return.
    assert type(result).model_validate_json(result.model_dump_json()) == result
    rows = normalise_rows("commitpackft", [COMMITPACKFT_ROW, {}], first_line=10)
    assert len(rows.records) == 1 and rows.errors[0].line == 11


def test_manifest_checks_size_then_sha256() -> None:
    data = b'{"a": 1}\n'
    manifest = Manifest(
        dataset="commitpackft",
        version="1",
        files=[
            ManifestEntry(
                name="python/data.jsonl", sha256=hashlib.sha256(data).hexdigest(), size=len(data)
            )
        ],
    )
    assert check_manifest(manifest, "python/data.jsonl", data).size == len(data)
    with pytest.raises(ManifestMismatch, match=r"python/data.jsonl: size 8 bytes"):
        check_manifest(manifest, "python/data.jsonl", data[:-1])
    with pytest.raises(ManifestMismatch, match="sha256"):
        check_manifest(manifest, "python/data.jsonl", data.replace(b"1", b"2"))
    with pytest.raises(ManifestMismatch, match="not listed"):
        check_manifest(manifest, "java/data.jsonl", data)


def test_meta_model_validates() -> None:
    good = {
        "source": "bigcode/commitpackft",
        "version": "2023-08",
        "license": "MIT",
        "downloaded_at": datetime(2026, 11, 24, tzinfo=UTC).isoformat(),
        "sha256": "0" * 64,
        "num_records": 12,
    }
    assert DatasetMeta.model_validate(good).num_records == 12
    assert DatasetMeta.model_validate({**good, "license": "Apache-2.0 OR MIT"})
    for field, bad in [
        ("license", "MIT license!"),
        ("sha256", "abc"),
        ("num_records", -1),
        ("downloaded_at", "2026-11-24T00:00:00"),
    ]:
        with pytest.raises(ValidationError) as err:
            DatasetMeta.model_validate({**good, field: bad})
        assert err.value.errors()[0]["loc"] == (field,)
    with pytest.raises(ValidationError):
        DatasetMeta.model_validate({k: v for k, v in good.items() if k != "source"})


def test_language_from_extension() -> None:
    assert language_from_extension("a/b.PY") == "python"
    assert language_from_extension("x.tsx") == "typescript"
    assert language_from_extension("Main.java") == "java"
    assert language_from_extension("Makefile") is None
    assert language_from_extension("dir.py/file") is None


def rec(instruction: str, pre: str, language: str = "python") -> NormalizedRecord:
    return NormalizedRecord(instruction=instruction, pre=pre, post=pre + "#", language=language)


def test_dedupe_and_token_filter() -> None:
    records = [rec("a", "x"), rec("a", "x", "java"), rec("a", "y"), rec("b", "x")]
    kept, dropped = dedupe(records)
    assert kept == [records[0], records[2], records[3]]
    assert dropped == 1
    long = rec("c", "z" * 10_000)
    kept, dropped = filter_tokens([*kept, long], heuristic_count_tokens)
    assert long not in kept and dropped == 1
    kept, dropped = filter_tokens([long], heuristic_count_tokens, max_tokens=5000)
    assert kept == [long] and dropped == 0


@given(st.text(min_size=1, max_size=30), st.text(max_size=60))
def test_split_is_a_pure_function_of_the_record(instruction: str, pre: str) -> None:
    record = rec(instruction, pre)
    assert assign_split(record) == assign_split(record.model_copy())
    assert assign_split(record) in ("train", "dev", "test")


def test_split_ratios_and_groups() -> None:
    records = [rec(f"task {i}", f"x = {i}\n", lang) for i in range(3000) for lang in ("python",)]
    records += [rec(f"task {i}", f"x = {i};\n", "typescript") for i in range(500)]
    records += [rec("go task", "x := 1\n", "go")]
    groups = split_by_language(records)
    assert set(groups) == {"python", "javascript"}
    py = {name: len(items) for name, items in groups["python"].items()}
    assert sum(py.values()) == 3000
    assert 220 <= py["test"] <= 380 and 220 <= py["dev"] <= 380
    # Order does not matter: the same records split the same way reversed.
    again = split_by_language(list(reversed(records)))
    assert {r.pre for r in again["python"]["test"]} == {r.pre for r in groups["python"]["test"]}
    with pytest.raises(ValueError):
        assign_split(records[0], dev=0.6, test=0.5)


def test_stats_report() -> None:
    records = [rec("a", "abcdef"), rec("b", "abc", "java"), rec("c", "abcdefghi")]
    report = stats_report("commitpackft", records, heuristic_count_tokens)
    assert report.startswith("# commitpackft\n")
    assert "- records: 3" in report
    assert "| python | 2 | 66.7% |" in report
    assert "| java | 1 | 33.3% |" in report
    # tokens of "a\nabcdef" (8 bytes -> 3) and "c\nabcdefghi" (11 -> 4): average 3.5
    assert "| python | 2 | 66.7% | 3.5 |" in report
    assert "- records: 0" in stats_report("empty", [], heuristic_count_tokens)


def test_flag_parse_tags_but_keeps_the_record() -> None:
    record = rec("a", "x = 1\n")
    assert flag_parse(record, True, True) is record
    flagged = flag_parse(record, True, False)
    assert flagged.tags == ["parse-failed", "parse-failed:post"]
    assert flagged.pre == record.pre
