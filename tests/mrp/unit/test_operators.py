"""Operators on disk: code digests, pins, ed25519 signatures, the allow-list, configs/mrp.yaml,
and compiling jobs against the real registry (activities.mrp.operators)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from activities.mrp.operators import (
    DEV_KEY_PATH,
    DEV_PUBLIC_KEY,
    MrpConfigError,
    OperatorRefused,
    code_digest,
    generate_key,
    invoke_map,
    load_mrp_config,
    load_operator,
    load_private_key,
    public_key_hex,
    sign_operator,
    verify_signature,
)
from keel.mrp import PolicyViolation
from keel.mrp.errors import RegistryError
from keel.mrp.registry import OperatorKind
from keel.mrp.sdk import OperatorContext
from keel.settings import Settings
from tests.support.mrp_operators import TEST_CONFIG

ROOT = Path(__file__).resolve().parents[3]
REAL_CONFIG = ROOT / "configs" / "mrp.yaml"
REAL_JOBS = Path(__file__).parent / "mrp_jobs" / "real"
SHIPPED = {
    "word-count@1.0.0": OperatorKind.MAP,
    "sentiment-label@1.0.0": OperatorKind.MAP,
    "amount-stats@1.0.0": OperatorKind.MAP,
    "numeric-sum@1.0.0": OperatorKind.REDUCE,
    "json-writer@1.0.0": OperatorKind.PRODUCE,
    "parquet-writer@1.0.0": OperatorKind.PRODUCE,
    "rules-check@1.0.0": OperatorKind.EVALUATE,
}


def write_config(path: Path, operator_paths: list[str], **extra: object) -> Path:
    data: dict[str, object] = {
        "operator_paths": operator_paths,
        "trusted_keys": {"keel-dev": DEV_PUBLIC_KEY},
        "allow": sorted(SHIPPED),
        "caps": {"allowed_egress": ["llm"], "require_signatures": True},
    }
    data.update(extra)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def copy_operator(name: str, dest_root: Path) -> Path:
    dest = dest_root / name
    shutil.copytree(ROOT / "operators" / name, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# -- the real config -------------------------------------------------------------------


def test_real_config_registers_every_shipped_operator_signed_and_allowed():
    cfg = load_mrp_config(Settings(env="test"))
    assert cfg.path == REAL_CONFIG.resolve()
    assert cfg.refused == {}
    assert {s.ref: s.kind for s in cfg.registry.operators} == SHIPPED
    for e in cfg.entries:
        assert e.signed_by == "keel-dev", e.ref
        assert e.allowed, e.ref
        assert e.actual_digest == e.spec.code_digest  # type: ignore[union-attr]
    assert cfg.caps.require_signatures
    assert cfg.trusted_keys == {"keel-dev": DEV_PUBLIC_KEY}


def test_dev_key_file_matches_the_trusted_public_key():
    assert public_key_hex(load_private_key(DEV_KEY_PATH)) == DEV_PUBLIC_KEY


def test_test_config_adds_the_fault_operators():
    cfg = load_mrp_config(path=TEST_CONFIG)
    assert cfg.refused == {}
    refs = {s.ref for s in cfg.registry.operators}
    assert {"flaky@1.0.0", "slow@1.0.0", "expensive@1.0.0"} <= refs
    assert set(SHIPPED) <= refs
    assert cfg.registry.get("expensive@1.0.0").cost_weight == 100


@pytest.mark.parametrize("job", sorted(p.name for p in REAL_JOBS.glob("*.yaml")))
def test_jobs_compile_against_the_real_registry(job: str):
    cfg = load_mrp_config(Settings(env="test"))
    text = (REAL_JOBS / job).read_text(encoding="utf-8")
    result = cfg.compile_job(text, source=job)
    again = cfg.compile_job(text, source=job)
    assert result.ir_json() == again.ir_json()
    assert result.manifest.digest() == again.manifest.digest()
    for op in result.manifest.operators:
        assert op.signed
        assert op.code_digest == cfg.registry.get(op.ref).code_digest
    assert result.policy_report.admitted
    # Every operator the IR names can be loaded from its folder.
    for binding in result.ir.operators.values():
        instance = cfg.load(binding.ref)
        assert instance.kind is binding.kind


def test_settings_point_at_the_config_file(tmp_path: Path):
    other = write_config(
        tmp_path / "mrp.yaml", [str(ROOT / "operators")], allow=["word-count@1.0.0"]
    )
    cfg = load_mrp_config(Settings(env="test", mrp_config=other))
    assert cfg.path == other.resolve()
    assert {e.ref for e in cfg.entries if e.allowed} == {"word-count@1.0.0"}


# -- pins --------------------------------------------------------------------------------


def test_code_digest_covers_code_not_operator_yaml_or_pycache(tmp_path: Path):
    folder = copy_operator("word_count", tmp_path)
    before = code_digest(folder)
    assert before == code_digest(ROOT / "operators" / "word_count")  # location does not count
    (folder / "__pycache__").mkdir(exist_ok=True)
    (folder / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"junk")
    (folder / "operator.yaml").write_text(
        (folder / "operator.yaml").read_text() + "\n# a comment\n", encoding="utf-8"
    )
    assert code_digest(folder) == before
    (folder / "extra.txt").write_text("x", encoding="utf-8")
    assert code_digest(folder) != before
    (folder / "extra.txt").unlink()
    # Renaming a file changes the digest even with the same bytes.
    (folder / "agent.py").rename(folder / "agent2.py")
    assert code_digest(folder) != before


def test_operator_whose_code_no_longer_matches_its_pin_is_refused_at_compile(tmp_path: Path):
    ops = tmp_path / "ops"
    for name in ("word_count", "numeric_sum", "json_writer", "rules_check"):
        copy_operator(name, ops)
    agent = ops / "word_count" / "agent.py"
    agent.write_text(agent.read_text() + "\n# patched after signing\n", encoding="utf-8")
    config = write_config(tmp_path / "mrp.yaml", ["ops"])

    cfg = load_mrp_config(path=config)
    refusal = cfg.refused["word-count@1.0.0"]
    assert refusal.reason == "code_mismatch"
    assert "word-count@1.0.0" not in {s.ref for s in cfg.registry.operators}
    assert "numeric-sum@1.0.0" in {s.ref for s in cfg.registry.operators}

    text = (REAL_JOBS / "wordcount.yaml").read_text(encoding="utf-8")
    with pytest.raises(OperatorRefused) as info:
        cfg.compile_job(text, source="wordcount.yaml")
    assert info.value.operator == "word-count@1.0.0"
    assert info.value.reason == "code_mismatch"
    assert "word-count@1.0.0" in str(info.value)
    assert isinstance(info.value, RegistryError)

    # Loading it directly (a worker with a stale folder) is refused too.
    spec = cfg.entries[[e.ref for e in cfg.entries].index("word-count@1.0.0")].spec
    assert spec is not None
    with pytest.raises(RegistryError, match="its pin is"):
        load_operator(spec, ops / "word_count")

    # Re-signing accepts the new code.
    sign_operator(ops / "word_count", load_private_key(DEV_KEY_PATH))
    cfg = load_mrp_config(path=config)
    assert cfg.refused == {}
    assert cfg.compile_job(text).policy_report.admitted


def test_allow_list_digest_pin_refuses_a_resigned_operator(tmp_path: Path):
    ops = tmp_path / "ops"
    folder = copy_operator("word_count", ops)
    pinned = f"word-count@1.0.0#{code_digest(folder)}"
    config = write_config(tmp_path / "mrp.yaml", ["ops"], allow=[pinned])
    assert load_mrp_config(path=config).entries[0].allowed
    agent = folder / "agent.py"
    agent.write_text(agent.read_text() + "\n# v2\n", encoding="utf-8")
    sign_operator(folder, load_private_key(DEV_KEY_PATH))
    entry = load_mrp_config(path=config).entries[0]
    assert entry.refusal is None
    assert not entry.allowed
    assert "allow-list pins" in (entry.allow_problem or "")


# -- signatures --------------------------------------------------------------------------


def test_signature_by_an_untrusted_key_is_refused(tmp_path: Path):
    ops = tmp_path / "ops"
    folder = copy_operator("word_count", ops)
    other_key = tmp_path / "other.pem"
    other_public = generate_key(other_key)
    assert (other_key.stat().st_mode & 0o777) == 0o600
    spec = sign_operator(folder, load_private_key(other_key))
    assert verify_signature(spec, {"other": other_public}) == "other"
    assert verify_signature(spec, {"keel-dev": DEV_PUBLIC_KEY}) is None

    cfg = load_mrp_config(path=write_config(tmp_path / "mrp.yaml", ["ops"]))
    assert cfg.refused["word-count@1.0.0"].reason == "bad_signature"
    trusted = write_config(tmp_path / "trusted.yaml", ["ops"], trusted_keys={"other": other_public})
    assert load_mrp_config(path=trusted).entries[0].signed_by == "other"


def test_edited_spec_under_a_valid_signature_is_refused(tmp_path: Path):
    folder = copy_operator("word_count", tmp_path / "ops")
    yaml_path = folder / "operator.yaml"
    # The code is unchanged, but the cost weight is lowered after signing.
    yaml_path.write_text(
        yaml_path.read_text().replace('cost_weight: "1"', 'cost_weight: "0"'), encoding="utf-8"
    )
    cfg = load_mrp_config(path=write_config(tmp_path / "mrp.yaml", ["ops"]))
    assert cfg.refused["word-count@1.0.0"].reason == "bad_signature"


def test_unsigned_operator_is_registered_and_refused_by_policy(tmp_path: Path):
    ops = tmp_path / "ops"
    for name in ("word_count", "numeric_sum", "json_writer", "rules_check"):
        copy_operator(name, ops)
    yaml_path = ops / "word_count" / "operator.yaml"
    lines = [ln for ln in yaml_path.read_text().splitlines() if not ln.startswith("signature:")]
    yaml_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = load_mrp_config(path=write_config(tmp_path / "mrp.yaml", ["ops"]))
    assert cfg.refused == {}
    assert cfg.registry.get("word-count@1.0.0").signature is None
    with pytest.raises(PolicyViolation) as info:
        cfg.compile_job((REAL_JOBS / "wordcount.yaml").read_text())
    assert info.value.rule_ids == ["MRP-P014"]


def test_same_operator_in_two_folders_is_refused(tmp_path: Path):
    copy_operator("word_count", tmp_path / "a")
    copy_operator("word_count", tmp_path / "b")
    cfg = load_mrp_config(path=write_config(tmp_path / "mrp.yaml", ["a", "b"]))
    assert cfg.refused["word-count@1.0.0"].reason == "duplicate"
    with pytest.raises(OperatorRefused, match="more than one folder"):
        cfg.operator_dir("word-count@1.0.0")


def test_invalid_operator_yaml_is_refused_with_the_field(tmp_path: Path):
    folder = copy_operator("word_count", tmp_path / "ops")
    yaml_path = folder / "operator.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("kind: map", "kind: mapper"))
    cfg = load_mrp_config(path=write_config(tmp_path / "mrp.yaml", ["ops"]))
    (refusal,) = cfg.refused.values()
    assert refusal.reason == "invalid_spec"
    assert "kind" in refusal.detail


# -- the config file ---------------------------------------------------------------------


def test_prod_refuses_a_config_that_trusts_the_dev_key():
    with pytest.raises(MrpConfigError, match="dev signing key"):
        load_mrp_config(Settings(env="prod"))


def test_bad_config_files_name_the_file_and_key(tmp_path: Path):
    bad = tmp_path / "mrp.yaml"
    bad.write_text("operator_paths: [x]\ncaps: {max_workers: 0}\n", encoding="utf-8")
    with pytest.raises(MrpConfigError, match=r"mrp.yaml: caps.max_workers"):
        load_mrp_config(path=bad)
    bad.write_text("trusted_keys: {k: nothex}\n", encoding="utf-8")
    with pytest.raises(MrpConfigError, match="64 lowercase hex"):
        load_mrp_config(path=bad)
    bad.write_text("unknown: 1\n", encoding="utf-8")
    with pytest.raises(MrpConfigError, match="unknown"):
        load_mrp_config(path=bad)
    with pytest.raises(MrpConfigError, match="cannot read"):
        load_mrp_config(path=tmp_path / "absent.yaml")


def test_handles_load_the_operator_from_its_folder(tmp_path: Path):
    cfg = load_mrp_config(path=TEST_CONFIG)
    handle = cfg.handle("flaky@1.0.0")
    again = type(handle).model_validate_json(handle.model_dump_json())
    instance = again.load()
    state = tmp_path / "attempts"
    ctx = OperatorContext(
        params={"state_dir": str(state), "fail_times": 0}, seed=1, shard_id="shard-000000"
    )
    assert invoke_map(handle.spec, instance, ["ab", "c"], ctx) == {"items": 2, "chars": 3}
    # The module lives in its own namespace, not on sys.path as "agent".
    assert type(instance).__module__.startswith("keel_mrp_operators.flaky_1_0_0_")
