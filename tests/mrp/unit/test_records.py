"""Record-sharded inputs (issue 27): the DSL keys, the scanner that cuts JSONL, CSV and
Parquet files into slices, what a shard reads back, and the compiler over those slices.

Files are generated here, in tmp; the scanner stores slice bytes in a dict-backed store
with the artifact store's ``put_bytes``/``get_bytes`` (content-addressed, verified)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from activities.mrp.inputs import resolve_inputs
from activities.mrp.records import read_slice, scan_record_file
from keel.digest import digest_bytes
from keel.mrp import compile_job
from keel.mrp.dsl import InputsSpec, parse_job
from keel.mrp.errors import DslError, InputsRefused
from keel.mrp.records import CsvRows, RecordSlice, iter_jsonl
from keel.settings import Settings
from tests.mrp.unit.mrp_jobs import load_caps, load_registry

REGISTRY = load_registry()
CAPS = load_caps()


class DictStore:
    """The artifact store's byte interface over a dict (digests checked on read)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put_bytes(self, data: bytes) -> str:
        digest = digest_bytes(data)
        self.blobs[digest] = data
        return digest

    def get_bytes(self, digest: str) -> bytes:
        data = self.blobs[digest]
        assert digest_bytes(data) == digest
        return data


def spec(fmt: str, **kw: Any) -> InputsSpec:
    if "records_per_shard" not in kw and "bytes_per_shard" not in kw:
        kw["records_per_shard"] = 10
    return InputsSpec(files=["data/*"], format=fmt, **kw)  # type: ignore[arg-type]


def scan(path: Path, inputs: InputsSpec, store: DictStore | None = None) -> Any:
    store = store or DictStore()
    ref, slices, bad = scan_record_file(f"data/{path.name}", path, inputs, store)  # type: ignore[arg-type]
    return ref, slices, bad, store


def read_all(slices: list[RecordSlice], store: DictStore) -> tuple[list[Any], list[str]]:
    good: list[Any] = []
    bad: list[str] = []
    for s in slices:
        g, b = read_slice(s, store)  # type: ignore[arg-type]
        good += g
        bad += [m.describe() for m in b]
    return good, bad


def write_jsonl(path: Path, n: int, *, trailing_newline: bool = True) -> Path:
    text = "\n".join(json.dumps({"id": i, "amount": i}) for i in range(n))
    path.write_text(text + ("\n" if trailing_newline else ""))
    return path


# -- DSL -------------------------------------------------------------------------------------


def test_format_needs_files_and_a_record_sharding_and_nothing_else() -> None:
    ok = InputsSpec(files=["d/*.jsonl"], format="jsonl", records_per_shard=5)
    assert ok.malformed_policy == "fail" and ok.items_per_shard == 1
    cases = [
        ({"items": [1], "format": "jsonl", "records_per_shard": 1}, "not from 'items'"),
        ({"files": ["a"], "format": "jsonl"}, "exactly one of 'records_per_shard'"),
        (
            {"files": ["a"], "format": "csv", "records_per_shard": 1, "bytes_per_shard": 9},
            "exactly one of 'records_per_shard'",
        ),
        ({"files": ["a"], "format": "csv", "records_per_shard": 1, "by": "item"}, "not 'shard_"),
        ({"files": ["a"], "by": "item", "records_per_shard": 3}, "needs 'format'"),
        ({"files": ["a"], "by": "item", "on_malformed": "skip"}, "needs 'format'"),
        ({"files": ["http://x/y"], "by": "item"}, "only URIs an input may name are s3"),
        ({"files": ["s3://bkt/../x"], "by": "item"}, "must not contain '..'"),
        ({"files": ["a"], "format": "xml", "records_per_shard": 1}, "jsonl"),
    ]
    for data, message in cases:
        with pytest.raises(ValueError, match=message):
            InputsSpec.model_validate(data)


def test_old_jobs_digest_as_before_the_record_keys_existed() -> None:
    # A job without `format` serialises without the new keys: its job digest, IR and
    # manifest are what they were.
    dumped = InputsSpec(files=["a/*.txt"], by="item").model_dump(mode="json")
    assert set(dumped) == {"items", "files", "shard_size", "by"}


def test_dsl_error_for_a_record_key_without_format_names_its_line() -> None:
    text = (Path(__file__).parent.joinpath("mrp_jobs/valid/wordcount.yaml").read_text()).replace(
        "  shard_size: 2", "  shard_size: 2\n  on_malformed: skip"
    )
    with pytest.raises(DslError, match="'on_malformed' needs 'format'") as info:
        parse_job(text, "wc.yaml")
    assert info.value.issues[0].path == "inputs"


# -- JSONL -----------------------------------------------------------------------------------


def test_jsonl_is_cut_by_records_with_lines_and_bytes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 25)
    ref, slices, bad, store = scan(path, spec("jsonl"))
    assert ref.size_bytes == path.stat().st_size and ref.digest == digest_bytes(path.read_bytes())
    assert [(s.first_record, s.record_count, s.start_line, s.end_line) for s in slices] == [
        (0, 10, 1, 10),
        (10, 10, 11, 20),
        (20, 5, 21, 25),
    ]
    data = path.read_bytes()
    for s in slices:
        assert s.byte_start is not None and s.byte_end is not None
        assert store.get_bytes(s.chunk_digest or "") == data[s.byte_start : s.byte_end]
    assert slices[-1].byte_end == len(data) and bad == []
    good, _ = read_all(slices, store)
    assert good == [{"id": i, "amount": i} for i in range(25)]


def test_trailing_newline_or_none_and_blank_lines_give_the_same_records(tmp_path: Path) -> None:
    with_nl = write_jsonl(tmp_path / "a.jsonl", 3)
    without = write_jsonl(tmp_path / "b.jsonl", 3, trailing_newline=False)
    blanks = tmp_path / "c.jsonl"
    blanks.write_bytes(b"\n" + with_nl.read_bytes().replace(b"\n", b"\r\n\n") + b"\n\n")
    bom = tmp_path / "d.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + with_nl.read_bytes())
    expected = [{"id": i, "amount": i} for i in range(3)]
    for path in (with_nl, without, blanks, bom):
        _, slices, bad, store = scan(path, spec("jsonl"))
        assert len(slices) == 1 and slices[0].record_count == 3 and bad == []
        assert read_all(slices, store)[0] == expected
    _, slices, _, _ = scan(blanks, spec("jsonl"))
    # Lines count blank lines too: the records are on lines 2, 4 and 6.
    assert (slices[0].start_line, slices[0].end_line) == (2, 6)


def test_records_per_shard_larger_than_the_file_is_one_shard(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 7)
    _, slices, _, _ = scan(path, spec("jsonl", records_per_shard=1_000_000))
    assert [(s.first_record, s.record_count) for s in slices] == [(0, 7)]


def test_empty_and_blank_files_have_no_slices(tmp_path: Path) -> None:
    for name, body in [("e.jsonl", b""), ("blank.jsonl", b"\n \n\r\n")]:
        (tmp_path / name).write_bytes(body)
        _, slices, bad, _ = scan(tmp_path / name, spec("jsonl"))
        assert slices == [] and bad == []


def test_bytes_per_shard_cuts_at_record_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "v.jsonl"
    lines = [json.dumps({"i": i, "pad": "x" * (i % 7) * 10}) + "\n" for i in range(200)]
    lines[50] = json.dumps({"i": 50, "pad": "y" * 3000}) + "\n"  # larger than a shard
    path.write_text("".join(lines))
    _, slices, _, store = scan(path, spec("jsonl", bytes_per_shard=1000))
    for s in slices:
        assert s.byte_start is not None and s.byte_end is not None
        size = s.byte_end - s.byte_start
        assert size <= 1000 or s.record_count == 1, s
    # Contiguous, every record once, in order.
    assert [s.first_record for s in slices] == [
        sum(t.record_count for t in slices[:k]) for k in range(len(slices))
    ]
    assert [r["i"] for r in read_all(slices, store)[0]] == list(range(200))


def test_malformed_jsonl_records_are_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(
        b'{"a": 1}\n{"a": 2,}\n[1, 2]\n{"a": NaN}\n\xff\xfe\n{"a": 6}\n"text"\n{"a": 8}'
    )
    _, slices, bad, store = scan(path, spec("jsonl", records_per_shard=3, on_malformed="skip"))
    assert [m.describe() for m in bad] == [
        "data/m.jsonl line 2: invalid JSON: Expecting property name enclosed in double quotes "
        "at column 9",
        "data/m.jsonl line 3: a JSONL record must be a JSON object, not list",
        "data/m.jsonl line 4: NaN is not JSON (no canonical form)",
        "data/m.jsonl line 5: not valid UTF-8 (byte 1)",
        "data/m.jsonl line 7: a JSONL record must be a JSON object, not str",
    ]
    # Malformed records keep their place: positions do not depend on the policy.
    assert [(s.first_record, s.record_count) for s in slices] == [(0, 3), (3, 3), (6, 2)]
    good, named = read_all(slices, store)
    assert good == [{"a": 1}, {"a": 6}, {"a": 8}]
    assert named == [m.describe() for m in bad]


def test_iter_jsonl_positions_from_the_middle_of_a_file() -> None:
    lines = [b'{"x": 1}\n', b"\n", b'{"x": 2}\n']
    recs = list(iter_jsonl(lines, first_line=41, offset=1000, first_index=7))
    assert [(r.index, r.line, r.start, r.end) for r in recs] == [
        (7, 41, 1000, 1009),
        (8, 43, 1010, 1019),
    ]


# -- CSV -------------------------------------------------------------------------------------


def test_csv_records_are_dicts_of_text_and_quoted_newlines_stay_in_one_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.csv"
    path.write_text('id,note\n1,"two\nlines"\n2,"a, b"\n\n3,""\n')
    _, slices, bad, store = scan(path, spec("csv", records_per_shard=2))
    assert bad == []
    assert [(s.first_record, s.record_count, s.start_line, s.end_line) for s in slices] == [
        (0, 2, 2, 4),
        (2, 1, 6, 6),
    ]
    assert slices[0].columns == ["id", "note"]
    assert read_all(slices, store)[0] == [
        {"id": "1", "note": "two\nlines"},
        {"id": "2", "note": "a, b"},
        {"id": "3", "note": ""},
    ]


def test_csv_header_only_and_empty_files_have_no_records(tmp_path: Path) -> None:
    for name, body in [("h.csv", "id,amount\n"), ("h2.csv", "id,amount"), ("e.csv", "")]:
        (tmp_path / name).write_text(body)
        _, slices, bad, _ = scan(tmp_path / name, spec("csv"))
        assert slices == [] and bad == []


def test_csv_wrong_column_count_and_stray_quotes_are_named_with_line_and_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "b.csv"
    path.write_text('id,amount,note\n1,2,x\n3,4\n5,6,"ok"\n7,8,"bad"x\n9,10,y,z\n11,12,end\n')
    _, slices, bad, store = scan(path, spec("csv", on_malformed="skip"))
    assert [m.describe() for m in bad] == [
        "data/b.csv line 3 (row 2): row has 2 fields, the header has 3",
        "data/b.csv line 5 (row 4): invalid CSV: ',' expected after '\"'",
        "data/b.csv line 6 (row 5): row has 4 fields, the header has 3",
    ]
    good, named = read_all(slices, store)
    assert [r["id"] for r in good] == ["1", "5", "11"]
    assert named == [m.describe() for m in bad]


def test_csv_header_that_cannot_name_columns_refuses_the_file(tmp_path: Path) -> None:
    for body, message in [("id,id\n1,2\n", "names column 'id' twice"), ("a,,b\n", "empty")]:
        path = tmp_path / "h.csv"
        path.write_text(body)
        with pytest.raises(InputsRefused, match=message):
            scan(path, spec("csv"))


def test_csv_rows_in_a_slice_read_as_in_the_whole_file() -> None:
    lines = [b"a,b\n", b"1,2\n", b'3,"x\n', b'y"\n']
    whole = list(CsvRows(lines))
    part = list(CsvRows(lines[1:], columns=["a", "b"], first_line=2, offset=4))
    assert whole == part
    assert [(r.line, r.value) for r in part] == [
        (2, {"a": "1", "b": "2"}),
        (3, {"a": "3", "b": "x\ny"}),
    ]


# -- Parquet ---------------------------------------------------------------------------------


def write_parquet(path: Path, n: int, row_group_size: int = 7) -> Path:
    table = pa.table({"id": list(range(n)), "amount": [f"{i}.5" for i in range(n)]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def test_parquet_rows_are_cut_across_row_groups(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", 30)
    ref, slices, bad, store = scan(path, spec("parquet", records_per_shard=10))
    assert ref.digest in store.blobs and bad == []
    assert [(s.first_record, s.record_count) for s in slices] == [(0, 10), (10, 10), (20, 10)]
    good, _ = read_all(slices, store)
    assert good == [{"id": i, "amount": f"{i}.5"} for i in range(30)]
    # Byte sharding goes by the row groups' sizes; every row once, in order.
    _, by_bytes, _, store2 = scan(path, spec("parquet", bytes_per_shard=100))
    assert len(by_bytes) > 1
    assert [r["id"] for r in read_all(by_bytes, store2)[0]] == list(range(30))


def test_parquet_values_become_json_and_nan_is_a_malformed_row(tmp_path: Path) -> None:
    import datetime as dt
    from decimal import Decimal

    path = tmp_path / "t.parquet"
    table = pa.table(
        {
            "when": [dt.date(2026, 1, 2), dt.date(2026, 1, 3)],
            "price": pa.array([Decimal("1.20"), Decimal("3.00")], pa.decimal128(5, 2)),
            "score": [0.5, float("nan")],
            "tags": [["a"], []],
        }
    )
    pq.write_table(table, path)
    _, slices, bad, store = scan(path, spec("parquet", on_malformed="skip"))
    assert [m.describe() for m in bad] == [
        "data/t.parquet row 2: column 'score': nan has no JSON form"
    ]
    assert read_all(slices, store)[0] == [
        {"when": "2026-01-02", "price": "1.20", "score": 0.5, "tags": ["a"]}
    ]


def test_unreadable_parquet_fails_or_is_skipped_whole(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputsRefused, match=r"data/x\.parquet: unreadable Parquet file"):
        scan(path, spec("parquet"))
    _, slices, bad, _ = scan(path, spec("parquet", on_malformed="skip"))
    assert slices == [] and len(bad) == 1
    assert bad[0].describe().startswith("data/x.parquet (whole file): unreadable Parquet file")


# -- Compiling record shards -----------------------------------------------------------------

JOB = """
dsl_version: "0.1"
job_id: records-demo
inputs:
  files: ["data/*.jsonl"]
  format: jsonl
  records_per_shard: 10
map:
  operator: tokens-count@1.0.0
reduce:
  operator: sum-counts@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {kind: json, destination: out/r.json}
policy:
  budget_units: "100"
  budget_usd: "1"
"""


def compile_dir(base: Path, text: str = JOB) -> Any:
    inputs = parse_job(text).spec.inputs
    store = DictStore()
    resolved = resolve_inputs(
        inputs,
        base_dir=str(base),
        settings=Settings(),
        caps=CAPS,
        store=store,  # type: ignore[arg-type]
        base_path=base,
    )
    result = compile_job(
        text, REGISTRY, CAPS, resolved_files=resolved.files, record_slices=resolved.slices
    )
    return result, resolved, store


def test_compiled_shards_name_their_records_and_are_stable(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "b.jsonl", 25)
    write_jsonl(tmp_path / "data" / "a.jsonl", 5)
    (tmp_path / "data" / "empty.jsonl").write_text("")
    result, resolved, _ = compile_dir(tmp_path)
    tasks = result.ir.map_tasks
    # One shard per slice, files in path order, shards never across files; an empty
    # file is listed but has no shard.
    assert [t.item_count for t in tasks] == [5, 10, 10, 5]
    assert [f.path for f in resolved.files] == ["data/a.jsonl", "data/b.jsonl", "data/empty.jsonl"]
    payloads = [result.shard_inputs[t.input_digest].records for t in tasks]
    assert [(p.file.path, p.first_record, p.start_line) for p in payloads if p] == [
        ("data/a.jsonl", 0, 1),
        ("data/b.jsonl", 0, 1),
        ("data/b.jsonl", 10, 11),
        ("data/b.jsonl", 20, 21),
    ]
    # Same bytes, same plan: identical IR (shard identities, seeds, checkpoint keys).
    again, _, _ = compile_dir(tmp_path)
    assert again.ir_json() == result.ir_json()
    # Editing one record changes the input digest of every shard of its file (a slice
    # names the whole file's digest too), never another file's; and through the inputs
    # digest every seed: checkpoints never serve stale output.
    (tmp_path / "data" / "b.jsonl").write_text(
        (tmp_path / "data" / "b.jsonl").read_text().replace('"amount": 12', '"amount": 13')
    )
    edited, _, _ = compile_dir(tmp_path)
    before = [t.input_digest for t in tasks]
    after = [t.input_digest for t in edited.ir.map_tasks]
    assert [b == a for b, a in zip(before, after, strict=True)] == [True, False, False, False]
    assert edited.ir.inputs_digest != result.ir.inputs_digest


def test_inputs_without_records_are_refused_with_the_line(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "empty.jsonl").write_text("\n")
    with pytest.raises(DslError, match="hold no jsonl records") as info:
        compile_dir(tmp_path)
    assert info.value.issues[0].line == 5


def test_slices_that_do_not_cover_a_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "a.jsonl", 25)
    _, resolved, _ = compile_dir(tmp_path)
    assert resolved.slices is not None
    with pytest.raises(DslError, match="gap or overlap"):
        compile_job(
            JOB, REGISTRY, CAPS, resolved_files=resolved.files, record_slices=resolved.slices[1:]
        )
    with pytest.raises(DslError, match="before compiling"):
        compile_job(JOB, REGISTRY, CAPS, resolved_files=resolved.files)
