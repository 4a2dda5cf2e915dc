"""``mrp operators list|lint|sign|keygen`` (cli/mrp_operators.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from activities.mrp.operators import DEV_KEY_PATH, DEV_PUBLIC_KEY, load_mrp_config
from cli.mrp_operators import app

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def tmp_config(tmp_path: Path, names: list[str], allow: list[str]) -> Path:
    ops = tmp_path / "ops"
    for name in names:
        shutil.copytree(
            ROOT / "operators" / name, ops / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    config = tmp_path / "mrp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "operator_paths": ["ops"],
                "trusted_keys": {"keel-dev": DEV_PUBLIC_KEY},
                "allow": allow,
                "caps": {"require_signatures": True},
            }
        ),
        encoding="utf-8",
    )
    return config


def test_list_shows_the_shipped_operators_as_json_and_table():
    result = runner.invoke(app, ["list", "--json"], env={"KEEL_ENV": "test"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    ops = {f"{o['name']}@{o['version']}": o for o in data["operators"]}
    assert len(ops) == 7
    assert all(
        o["signed_by"] == "keel-dev" and o["allowed"] and o["status"] == "ok" for o in ops.values()
    )
    assert ops["numeric-sum@1.0.0"]["kind"] == "reduce"
    table = runner.invoke(app, ["list", "--text"], env={"KEEL_ENV": "test"})
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "KIND", "DIGEST", "SIGNED", "ALLOWED", "STATUS"]
    assert any(line.split()[:3] == ["word-count", "1.0.0", "map"] for line in lines)


def test_lint_passes_on_the_shipped_operators():
    result = runner.invoke(app, ["lint", "--text"], env={"KEEL_ENV": "test"})
    assert result.exit_code == 0, result.output
    assert "7 operators checked, 0 errors, 0 warnings" in result.output


def test_lint_fails_on_changed_code_and_sign_fixes_it(tmp_path: Path):
    config = tmp_config(tmp_path, ["word_count", "amount_stats"], ["word-count@1.0.0"])
    agent = tmp_path / "ops" / "word_count" / "agent.py"
    agent.write_text(agent.read_text() + "\n# changed\n", encoding="utf-8")

    result = runner.invoke(app, ["lint", "-c", str(config), "--json"], env={"KEEL_ENV": "test"})
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["errors"] == 1
    (error,) = [p for p in report["problems"] if p["level"] == "error"]
    assert error["operator"] == "word-count@1.0.0"
    assert error["message"].startswith("code_mismatch:")
    warnings = [p for p in report["problems"] if p["level"] == "warning"]
    assert [w["operator"] for w in warnings] == ["amount-stats@1.0.0"]  # not allow-listed

    yaml_before = (tmp_path / "ops" / "word_count" / "operator.yaml").read_text()
    result = runner.invoke(
        app,
        ["sign", "--key", str(DEV_KEY_PATH), "word-count@1.0.0", "-c", str(config), "--text"],
        env={"KEEL_ENV": "test"},
    )
    assert result.exit_code == 0, result.output
    assert "signed word-count@1.0.0" in result.output
    yaml_after = (tmp_path / "ops" / "word_count" / "operator.yaml").read_text()
    # Only the pin lines changed; comments and layout stay.
    changed = [
        a for a, b in zip(yaml_before.splitlines(), yaml_after.splitlines(), strict=True) if a != b
    ]
    assert [c.split(":")[0] for c in changed] == ["code_digest", "signature"]
    assert yaml_after.startswith("# word-count")

    assert runner.invoke(app, ["lint", "-c", str(config)], env={"KEEL_ENV": "test"}).exit_code == 0
    assert load_mrp_config(path=config).refused == {}


def test_lint_reports_allow_list_entries_with_no_operator(tmp_path: Path):
    config = tmp_config(tmp_path, ["word_count"], ["word-count@1.0.0", "ghost@1.0.0"])
    result = runner.invoke(app, ["lint", "-c", str(config), "--text"], env={"KEEL_ENV": "test"})
    assert result.exit_code == 1
    assert "error: ghost@1.0.0: allow-listed" in result.output


def test_sign_refuses_the_dev_key_in_prod(tmp_path: Path):
    config = tmp_config(tmp_path, ["word_count"], ["word-count@1.0.0"])
    before = (tmp_path / "ops" / "word_count" / "operator.yaml").read_bytes()
    result = runner.invoke(
        app,
        ["sign", "--key", str(DEV_KEY_PATH), "--all", "-c", str(config), "--json"],
        env={"KEEL_ENV": "prod"},
    )
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert (error["family"], error["type"], error["exit_code"]) == ("mrp", "config", 1)
    assert "dev signing key" in error["message"]
    assert (tmp_path / "ops" / "word_count" / "operator.yaml").read_bytes() == before


def test_keygen_then_sign_with_a_new_key_needs_it_trusted(tmp_path: Path):
    config = tmp_config(tmp_path, ["word_count"], ["word-count@1.0.0"])
    key = tmp_path / "team.ed25519"
    result = runner.invoke(app, ["keygen", str(key), "--text"])
    assert result.exit_code == 0, result.output
    public = result.output.strip().splitlines()[-1].split(": ")[1]
    assert len(public) == 64
    result = runner.invoke(
        app,
        ["sign", "--key", str(key), "--all", "-c", str(config), "--text"],
        env={"KEEL_ENV": "test"},
    )
    assert result.exit_code == 0, result.output
    assert "not in trusted_keys" in result.output
    assert load_mrp_config(path=config).refused["word-count@1.0.0"].reason == "bad_signature"
    # Refuses to overwrite an existing key.
    assert runner.invoke(app, ["keygen", str(key)]).exit_code != 0


def test_sign_needs_targets():
    result = runner.invoke(app, ["sign", "--key", str(DEV_KEY_PATH)], env={"KEEL_ENV": "test"})
    assert result.exit_code == 2
