"""The six dataset loaders on tiny fixtures in each dataset's published format
(tests/srl/fixtures/datasets/, written by make_fixtures.py, with their own manifests)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from activities.srl.data import (
    DataError,
    DatasetFileMissing,
    DownloadImpossible,
    ManifestRequired,
    ingest_dataset,
    load_config,
    read_meta,
    read_normalized,
)
from keel.srl.datasets import MAPPERS, DatasetMeta, NormalizedRecord
from keel.srl.errors import ManifestMismatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"

# dataset -> (records that map, [(file, line, field)] of the malformed ones)
EXPECTED: dict[str, tuple[int, list[tuple[str, int, str]]]] = {
    "commitpackft": (
        3,
        [
            ("data/python/data.jsonl", 3, "<json>"),
            ("data/javascript/data.jsonl", 2, "old_contents"),
        ],
    ),
    "ocedataft": (
        2,
        [
            (
                "datasets/ocedataft.jsonl",
                3,
                "instruct_purify|instruction|descriptive_instruction|lazy_instruction",
            )
        ],
    ),
    "editpackft": (2, [("data/train-00000-of-00001.parquet", 3, "new_contents")]),
    "agentpack": (2, [("train/fixture-000.jsonl.gz", 3, "patch")]),
    "marv": (1, [("marv.jsonl", 2, "code_after|after|refactored_code|post")]),
    "smellycode": (1, [("smellycode.jsonl", 2, "instruction")]),
}


def manifest(dataset: str) -> Path:
    return FIXTURES / dataset / "manifest.json"


def test_every_mapper_has_a_config_entry_and_a_fixture() -> None:
    config = load_config()
    assert set(config.datasets) == set(MAPPERS) == set(EXPECTED)
    for name, spec in config.datasets.items():
        assert spec.files, name
        listed = json.loads(manifest(name).read_text())["files"]
        assert all((FIXTURES / name / f["name"]).is_file() for f in listed)


@pytest.mark.parametrize("dataset", sorted(EXPECTED))
def test_ingest_normalises_and_reports_malformed_lines(dataset: str, tmp_path: Path) -> None:
    result = ingest_dataset(dataset, FIXTURES / dataset, tmp_path, manifest_path=manifest(dataset))
    count, malformed = EXPECTED[dataset]
    assert result.num_records == count
    assert [(m.file, m.error.line, m.error.field) for m in result.malformed] == malformed
    assert all(m.render().startswith(f"{m.file}:{m.error.line}: ") for m in result.malformed)

    records = read_normalized(tmp_path, dataset)
    assert len(records) == count
    assert all(isinstance(r, NormalizedRecord) and r.pre != r.post for r in records)
    errors = (tmp_path / "raw" / dataset / "normalized" / "errors.jsonl").read_text().splitlines()
    assert len(errors) == len(malformed)

    meta = read_meta(tmp_path, dataset)
    assert meta == DatasetMeta.model_validate_json(
        (tmp_path / "raw" / dataset / "_meta.json").read_bytes()
    )
    assert meta.num_records == count and meta.version == "fixture-1"
    assert meta.license == load_config().spec(dataset).license
    files = json.loads(manifest(dataset).read_text())["files"]
    if len(files) == 1:
        assert meta.sha256 == files[0]["sha256"]
    for f in files:  # the published files are kept byte for byte
        copy = tmp_path / "raw" / dataset / "source" / f["name"]
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == f["sha256"]


def test_records_carry_the_published_fields(tmp_path: Path) -> None:
    """Spot checks that each mapper read the right fields of its format."""
    by_ds = {}
    for dataset in EXPECTED:
        ingest_dataset(dataset, FIXTURES / dataset, tmp_path, manifest_path=manifest(dataset))
        by_ds[dataset] = read_normalized(tmp_path, dataset)
    cp = by_ds["commitpackft"]
    assert [(r.instruction, r.language) for r in cp] == [
        ("Use math.pi", "python"),
        ("Half an edit", "python"),
        ("Use an arrow function", "javascript"),
    ]
    # OCEDataFT: the instruction is cut out of the Alpaca prompt / the ShareGPT user turn.
    assert [r.instruction for r in by_ds["ocedataft"]] == [
        "Replace the literal 3.14 with math.pi.",
        "use math.pi",
    ]
    assert {r.language for r in by_ds["ocedataft"]} == {"python"}
    assert [r.language for r in by_ds["editpackft"]] == ["python", "java"]
    assert by_ds["editpackft"][1].instruction == "Qualify the field access with this."
    # AgentPack: the one-hunk patch's sides, the description, the path from the diff.
    ap = by_ds["agentpack"]
    assert [(r.language, r.file) for r in ap] == [
        ("python", "src/geo.py"),
        ("typescript", "src/id.ts"),
    ]
    assert ap[0].pre == "def area(r):\n    return 3.14 * r * r\n"
    assert ap[0].post.startswith("import math\n") and ap[0].tags == [
        "agentpack",
        "fragment",
        "agent:claude",
    ]
    assert ap[1].instruction == "Make id generic over its argument type."
    assert cp[0].file == "geo.py" and by_ds["marv"][0].file == "src/Box.java"
    assert by_ds["marv"][0].instruction == "Apply this refactoring: Rename Method"
    assert by_ds["smellycode"][0].instruction.endswith("Magic Number")
    # The parquet fixtures really are parquet with the card's columns.
    table = pq.read_table(FIXTURES / "editpackft" / "data" / "train-00000-of-00001.parquet")
    assert {"ndiff", "instruction", "content", "old_contents"} <= set(table.column_names)


@pytest.mark.parametrize("dataset", sorted(EXPECTED))
def test_an_unconfirmed_layout_is_named_at_run_time(
    dataset: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = load_config().spec(dataset)
    with caplog.at_level("WARNING", logger="activities.srl.data"):
        result = ingest_dataset(
            dataset, FIXTURES / dataset, tmp_path, manifest_path=manifest(dataset)
        )
    assert result.fields_confirmed == spec.fields_confirmed
    assert spec.layout_sources, dataset  # confirmed or not, what was read is listed
    if spec.fields_confirmed:
        assert result.warnings == [] and not caplog.records
    else:
        assert len(result.warnings) == 1 and "NOT confirmed" in result.warnings[0]
        assert result.warnings[0].startswith(f"{dataset}: ")
        assert [r.getMessage() for r in caplog.records] == result.warnings


def test_which_layouts_are_confirmed() -> None:
    confirmed = {name for name, spec in load_config().datasets.items() if spec.fields_confirmed}
    assert confirmed == {"commitpackft", "ocedataft", "editpackft"}


def test_a_corrupt_gzip_shard_is_an_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    junk = b"\x1f\x8b not gzip"
    (src / "train" / "x.jsonl.gz").write_bytes(junk)
    own = tmp_path / "manifest.json"
    own.write_text(json.dumps({"dataset": "agentpack", "version": "x", "files": [
        {"name": "train/x.jsonl.gz", "sha256": hashlib.sha256(junk).hexdigest(), "size": len(junk)}
    ]}))  # fmt: skip
    with pytest.raises(DataError, match="not a readable gzip file"):
        ingest_dataset("agentpack", src, tmp_path / "out", manifest_path=own)
    assert not (tmp_path / "out").exists()


def _copy(dataset: str, tmp: Path) -> Path:
    dest = tmp / "src" / dataset
    shutil.copytree(FIXTURES / dataset, dest)
    return dest


def test_checksum_mismatch_writes_nothing_and_names_the_file(tmp_path: Path) -> None:
    src = _copy("commitpackft", tmp_path)
    # The second file of the manifest, same size, one byte changed: the first file
    # passes its check, and still nothing may be written.
    target = src / "data" / "javascript" / "data.jsonl"
    data = bytearray(target.read_bytes())
    data[10] = ord("X") if data[10] != ord("X") else ord("Y")
    target.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ManifestMismatch) as err:
        ingest_dataset("commitpackft", src, out, manifest_path=manifest("commitpackft"))
    assert err.value.name == "data/javascript/data.jsonl"
    assert "sha256" in str(err.value) and "data/javascript/data.jsonl" in str(err.value)
    assert not out.exists()


def test_size_mismatch_against_the_published_manifest(tmp_path: Path) -> None:
    # configs/srl/datasets.yaml carries OCEDataFT's real published sha256 and size (Git
    # LFS pointer); the tiny fixture is not that file.
    out = tmp_path / "out"
    with pytest.raises(ManifestMismatch) as err:
        ingest_dataset("ocedataft", FIXTURES / "ocedataft", out)
    assert err.value.name == "datasets/ocedataft.jsonl"
    assert "116153590" in str(err.value)
    assert not out.exists()


def test_without_local_files_the_error_names_url_and_credential(tmp_path: Path) -> None:
    with pytest.raises(DownloadImpossible) as err:
        ingest_dataset("agentpack", None, tmp_path / "out")
    text = str(err.value)
    assert "no network" in text and "https://huggingface.co/datasets/nuprl/AgentPack" in text
    assert "$HF_TOKEN" in text and "--from" in text
    assert not (tmp_path / "out").exists()


def test_unknown_published_hashes_need_a_user_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestRequired, match="--manifest"):
        ingest_dataset("commitpackft", FIXTURES / "commitpackft", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_listed_file_that_is_missing_is_named(tmp_path: Path) -> None:
    src = _copy("marv", tmp_path)
    (src / "marv.jsonl").unlink()
    with pytest.raises(DatasetFileMissing, match=r"marv\.jsonl"):
        ingest_dataset("marv", src, tmp_path / "out", manifest_path=manifest("marv"))
    assert not (tmp_path / "out").exists()


def test_a_reingest_replaces_the_previous_one_whole(tmp_path: Path) -> None:
    ingest_dataset(
        "commitpackft", FIXTURES / "commitpackft", tmp_path, manifest_path=manifest("commitpackft")
    )
    full = json.loads(manifest("commitpackft").read_text())
    python_only = {**full, "files": [f for f in full["files"] if "python" in f["name"]]}
    own = tmp_path / "python-only.json"
    own.write_text(json.dumps(python_only))
    result = ingest_dataset("commitpackft", FIXTURES / "commitpackft", tmp_path, manifest_path=own)
    assert result.num_records == 2
    source = tmp_path / "raw" / "commitpackft" / "source"
    assert sorted(p.relative_to(source).as_posix() for p in source.rglob("*.jsonl")) == [
        "data/python/data.jsonl"
    ]
    assert read_meta(tmp_path, "commitpackft").num_records == 2
    assert [p.name for p in (tmp_path / "raw").iterdir()] == ["commitpackft"]


def test_a_manifest_of_another_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="'marv'"):
        ingest_dataset(
            "smellycode", FIXTURES / "smellycode", tmp_path, manifest_path=manifest("marv")
        )


def test_a_corrupt_parquet_file_is_an_error_not_an_empty_dataset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    junk = b"PAR1 this is not parquet"
    (src / "data" / "train-00000-of-00001.parquet").write_bytes(junk)
    own = tmp_path / "manifest.json"
    own.write_text(
        json.dumps(
            {
                "dataset": "editpackft",
                "version": "x",
                "files": [
                    {
                        "name": "data/train-00000-of-00001.parquet",
                        "sha256": hashlib.sha256(junk).hexdigest(),
                        "size": len(junk),
                    }
                ],
            }
        )
    )
    with pytest.raises(DataError, match="not a readable parquet file"):
        ingest_dataset("editpackft", src, tmp_path / "out", manifest_path=own)
    assert not (tmp_path / "out").exists()
