"""What ``mrp replay`` and ``mrp inspect --download`` decide, now in ``keel.mrp.run`` and
``client.mrp`` (issue 41): the digests a replay compares, and the digest-verified copy of a
run's outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.mrp import OutputCorrupted, OutputMissing, download_outputs
from keel.digest import digest_bytes
from keel.mrp.run import ProducedFileRecord, RunManifest, ShardOutputRecord
from store.artifacts import LocalArtifactStore


def _manifest(
    store: LocalArtifactStore,
    outputs: dict[str, bytes],
    shard_outputs: list[str],
    *,
    root: Path | None,
) -> RunManifest:
    d = store.put_bytes(b"{}")
    return RunManifest(
        run_id="r1",
        job_id="job",
        workflow_id="mrp/job/r1",
        status="succeeded",
        backend="threads",
        ir_digest=store.put_bytes(b'{"ir": 1}'),
        manifest_digest=store.put_bytes(b'{"manifest": 1}'),
        policy_report_digest=d,
        job_yaml_digest=d,
        # Listed out of index order: the comparison orders shards by index.
        shards=[
            ShardOutputRecord(
                shard_index=len(shard_outputs) - 1 - i,
                shard_id=f"shard-{len(shard_outputs) - 1 - i:06d}",
                input_digest=d,
                checkpoint_key=d,
                output_digest=out,
            )
            for i, out in enumerate(reversed(shard_outputs))
        ],
        reduce_digest=digest_bytes(b"reduced"),
        output_root=str(root) if root is not None else None,
        produced=[
            ProducedFileRecord(path=p, digest=digest_bytes(data), size=len(data))
            for p, data in outputs.items()
        ],
    )


def test_replay_comparison_orders_shards_reduce_then_files(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "cas")
    files = {"b.txt": b"b", "a.txt": b"a"}
    original = _manifest(store, files, ["d0", "d1", "d2"], root=tmp_path)
    replayed = _manifest(store, {**files, "a.txt": b"A"}, ["d0", "x1", "d2"], root=tmp_path)
    rows = original.replay_comparison(replayed)
    assert [r["what"] for r in rows] == [
        "shard-000000",
        "shard-000001",
        "shard-000002",
        "reduce",
        "produced:a.txt",
        "produced:b.txt",
    ]
    assert [r["what"] for r in rows if not r["same"]] == ["shard-000001", "produced:a.txt"]
    assert rows[1] == {"what": "shard-000001", "original": "d1", "replay": "x1", "same": False}
    # No replay manifest (the replay failed before writing one): every row differs.
    missing = original.replay_comparison(None)
    assert len(missing) == 6
    assert all(r["replay"] is None and not r["same"] for r in missing)


def test_download_copies_verified_outputs_and_manifests(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "cas")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "result.jsonl").write_bytes(b'{"n": 1}\n')
    manifest = _manifest(store, {"sub/result.jsonl": b'{"n": 1}\n'}, ["d0"], root=out)
    dest = tmp_path / "dest"
    got = download_outputs(manifest, store, dest)
    assert [Path(g["path"]).relative_to(dest).as_posix() for g in got] == [
        "sub/result.jsonl",
        "IR.json",
        "manifest.json",
        "policy_report.json",
        "run-manifest.json",
    ]
    assert (dest / "sub" / "result.jsonl").read_bytes() == b'{"n": 1}\n'
    assert (dest / "IR.json").read_bytes() == b'{"ir": 1}'
    assert got[-1]["digest"] == manifest.digest()
    assert (dest / "run-manifest.json").read_bytes() == manifest.to_json()


def test_download_refuses_a_changed_or_missing_output(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "cas")
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.txt").write_bytes(b"changed since the run")
    manifest = _manifest(store, {"result.txt": b"as the run wrote it"}, ["d0"], root=out)
    with pytest.raises(OutputCorrupted, match="no longer has digest"):
        download_outputs(manifest, store, tmp_path / "dest")
    (out / "result.txt").unlink()
    with pytest.raises(OutputMissing, match="cannot read output"):
        download_outputs(manifest, store, tmp_path / "dest2")
    rootless = _manifest(store, {"result.txt": b"x"}, ["d0"], root=None)
    with pytest.raises(OutputMissing, match="no output root"):
        download_outputs(rootless, store, tmp_path / "dest3")
