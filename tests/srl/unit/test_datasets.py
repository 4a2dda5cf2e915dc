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
    PatchHunk,
    assign_split,
    check_manifest,
    dedupe,
    filter_tokens,
    flag_parse,
    language_from_extension,
    normalise_lines,
    normalise_rows,
    parse_unified_diff,
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
        file="main.py",
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


@pytest.mark.parametrize("dataset", ["ocedataft", "marv", "smellycode"])
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
    assert rec.tags == [dataset] and rec.file == "src/A.java"
    with pytest.raises(MalformedRecord) as err:
        MAPPERS[dataset]({k: v for k, v in row.items() if k != fields["pre"][-1]}, 9)
    assert err.value.line == 9
    assert fields["pre"][0] in err.value.field


ONE_HUNK = """diff --git a/pkg/util.py b/pkg/util.py
index 3f2a..9c1b 100644
--- a/pkg/util.py
+++ b/pkg/util.py
@@ -10,4 +10,4 @@ def helper():
 def total(xs):
-    return sum([x for x in xs])
+    return sum(x for x in xs)

 VERSION = 1
\\ No newline at end of file
"""


def test_a_unified_diff_is_read_into_files_and_hunks() -> None:
    [changed] = parse_unified_diff(ONE_HUNK)
    assert (changed.old_path, changed.new_path) == ("pkg/util.py", "pkg/util.py")
    # A blank context line that lost its leading space still counts; the last line has no
    # newline on either side.
    assert changed.hunks == [
        PatchHunk(
            old="def total(xs):\n    return sum([x for x in xs])\n\nVERSION = 1",
            new="def total(xs):\n    return sum(x for x in xs)\n\nVERSION = 1",
        )
    ]
    created = parse_unified_diff("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n")
    assert created[0].old_path is None and created[0].hunks == [PatchHunk("", "x = 1\n")]
    with pytest.raises(ValueError, match="shorter than its @@ header"):
        parse_unified_diff("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\n")
    with pytest.raises(ValueError, match="before any --- / \\+\\+\\+ file header"):
        parse_unified_diff("@@ -1 +1 @@\n-a\n+b\n")


def test_agentpack_keeps_one_file_one_hunk_edits() -> None:
    row = {"event_id": "e1", "agent": "codex", "description": "Use a generator", "patch": ONE_HUNK}
    rec = MAPPERS["agentpack"](row, 7)
    assert rec.instruction == "Use a generator" and rec.language == "python"
    assert rec.file == "pkg/util.py" and rec.tags == ["agentpack", "fragment", "agent:codex"]
    assert rec.pre.startswith("def total(xs):\n    return sum([")
    # The description under another of the names public loaders try.
    assert MAPPERS["agentpack"]({"message": "m", "patch": ONE_HUNK}, 1).instruction == "m"
    refusals = {
        "two files": ONE_HUNK + ONE_HUNK.replace("util.py", "other.py"),
        "two hunks": ONE_HUNK.replace("\\ No newline at end of file\n", "")
        + "@@ -20 +20 @@\n-a = 1\n+a = 2\n",
        "a new file": "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n",
        "not a diff": "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n",
        "no file": "just words",
    }
    messages = {}
    for why, patch in refusals.items():
        with pytest.raises(MalformedRecord) as err:
            MAPPERS["agentpack"]({"description": "d", "patch": patch}, 3)
        assert (err.value.line, err.value.field) == (3, "patch"), why
        messages[why] = err.value.message
    assert "changes 2 files" in messages["two files"]
    assert "2 hunks" in messages["two hunks"]
    assert "creates or deletes" in messages["a new file"]
    assert "not a unified diff" in messages["not a diff"]
    assert "changes 0 files" in messages["no file"]
    with pytest.raises(MalformedRecord) as err:
        MAPPERS["agentpack"]({"patch": ONE_HUNK}, 4)
    assert "description" in err.value.field


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
