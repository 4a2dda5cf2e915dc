"""keel.srl.trajectory: the §7 step record, its key, the episode id and the SQL row."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from keel.digest import digest_bytes
from keel.srl.rewards import Reward
from keel.srl.trajectory import (
    SCHEMA_VERSION,
    ModelOutput,
    StepRecord,
    StepRow,
    episode_id,
    parse_episode_sample,
    precision_lines,
    precision_report,
    step_key,
)


def record(step: int = 1, reward: Reward | None = None, error: str | None = None) -> StepRecord:
    return StepRecord(
        task_id="py-rename-0001",
        step=step,
        prompt={"instruction": "rename", "state": "<state>…</state>"},
        state_before={"goals": ["rename"]},
        model_output=ModelOutput(
            think="t",
            action={"pattern": "a", "rewrite": "b", "language": "python"},
            state_update={},
            raw="<think>t</think>…",
            format_error=error,
        ),
        sandbox_result={"exit_code": 0},
        reward=reward,
    )


def test_ids_and_keys() -> None:
    assert episode_id("c1", "py-rename-0001") == "srl/c1/py-rename-0001"
    assert parse_episode_sample("srl/c1/py-rename-0001") == ("c1", "py-rename-0001", 0)
    assert step_key("py-rename-0001", 3) == "py-rename-0001#3"
    for bad in ("srl/c1", "x/c1/t", "srl/c 1/t", "srl/c1/t/u"):
        with pytest.raises(ValueError):
            parse_episode_sample(bad)
    with pytest.raises(ValueError):
        episode_id("c1", "../etc")
    with pytest.raises(ValueError):
        step_key("t", 0)


def test_jsonl_round_trip_is_canonical() -> None:
    rec = record(reward=Reward(format_ok=True, verified=True, step_similarity=1.0, total=2.0))
    line = rec.to_jsonl()
    assert "\n" not in line
    keys = list(json.loads(line))
    assert keys == sorted(keys) and keys[0] == "expert_action"
    assert StepRecord.from_jsonl(line) == rec
    assert rec.schema_version == SCHEMA_VERSION
    assert rec.key == "py-rename-0001#1"


def test_record_refuses_unknown_fields_and_versions() -> None:
    data = record().model_dump()
    with pytest.raises(ValidationError):
        StepRecord.model_validate({**data, "extra": 1})
    with pytest.raises(ValidationError):
        StepRecord.model_validate({**data, "schema_version": 2})


def test_row_from_record() -> None:
    reward = Reward(
        format_ok=True,
        verified=False,
        diff_added=2,
        diff_removed=1,
        step_similarity=0.5,
        total=0.47,
    )
    rec = record(step=2, reward=reward)
    row = StepRow.from_record(
        rec, collection="c1", source="teacher", model="glm", language="python", template="rename"
    )
    assert row.step_key == "py-rename-0001#2"
    assert (row.verified, row.diff_lines, row.reward_total) == (False, 3, 0.47)
    assert row.record_digest == digest_bytes(row.record_json.encode())
    assert StepRecord.from_jsonl(row.record_json) == rec
    # The same record gives the same row: a second insert is recognisably the same step.
    again = StepRow.from_record(
        rec, collection="c1", source="teacher", model="glm", language="python", template="rename"
    )
    assert again == row
    bad = StepRow.from_record(
        record(error="missing_tag: no <action>"),
        collection="c1",
        source="actor",
        model="m",
        language="python",
    )
    assert not bad.format_ok
    assert bad.reward_total is None


def test_precision_report_keeps_sources_apart() -> None:
    def row(step: int, source: str, ok: bool | None, error: str | None = None) -> StepRow:
        reward = (
            None
            if ok is None
            else Reward(format_ok=True, verified=ok, step_similarity=0.5, total=1.0 if ok else 0.5)
        )
        return StepRow.from_record(
            record(step=step, reward=reward, error=error),
            collection="c1",
            source=source,  # type: ignore[arg-type]
            model="gold" if source == "gold_replay" else "qwen",
            language="python",
            template="rename",
        )

    rows = [
        row(1, "actor", True),
        row(2, "actor", False),
        row(3, "actor", None, error="missing_tag: no <action>"),
        row(4, "actor", None),  # not scored yet: left out
        row(5, "gold_replay", True),
    ]
    lines = precision_lines(rows)
    assert [(p.source, p.verified, p.total) for p in lines] == [
        ("actor", 1, 3),
        ("gold_replay", 1, 1),
    ]
    report = precision_report(rows)
    assert "| actor | qwen | python | rename | 1 | 3 | 33.3% |" in report
    assert "- actor: 1 / 3 verified" in report
    assert "- gold_replay: 1 / 1 verified" in report
