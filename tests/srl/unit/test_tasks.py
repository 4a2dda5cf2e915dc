"""``srl tasks``: processed records as collection tasks without a gold action
(keel.srl.tasks, activities.srl.splits)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.srl.data import DataError
from activities.srl.splits import write_tasks
from keel.srl.datasets import PARSE_FAILED_TAG, NormalizedRecord
from keel.srl.steps import MAX_FILE_CHARS, SrlTask, TasksInvalid, parse_tasks
from keel.srl.tasks import (
    MAX_INSTRUCTION_CHARS,
    REFUSALS,
    record_task,
    task_id,
    tasks_from_records,
)
from keel.srl.trajectory import check_id

PY_PRE = "def area(r):\n    return 3.14 * r * r\n"
PY_POST = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n"


def rec(**kw: object) -> NormalizedRecord:
    fields: dict[str, object] = {
        "instruction": "Use math.pi",
        "pre": PY_PRE,
        "post": PY_POST,
        "language": "python",
        "tags": ["commitpackft", "license:mit"],
        "file": "geo/area.py",
    }
    fields.update(kw)
    return NormalizedRecord.model_validate(fields)


def test_a_record_becomes_a_task_without_a_gold_action() -> None:
    task = record_task(rec())
    assert isinstance(task, SrlTask)
    assert task.gold_action is None and task.template is None
    assert (task.instruction, task.language, task.file) == ("Use math.pi", "python", "geo/area.py")
    assert (task.pre, task.post) == (PY_PRE, PY_POST)
    assert task.file_name == "area.py"
    assert task.task_id == task_id(rec()) and task.task_id.startswith("commitpackft-")
    assert len(task.task_id) == len("commitpackft-") + 16
    # The line parses back as a task file line.
    [again] = parse_tasks(task.model_dump_json().encode())
    assert again == task


def test_ids_are_stable_check_id_safe_and_differ_by_content() -> None:
    odd = rec(tags=["my dataset/v2 (beta)"])
    assert check_id(task_id(odd), "task id") == task_id(odd)
    assert task_id(odd).startswith("my-dataset-v2--beta--")
    assert task_id(rec(tags=[])).startswith("record-")
    assert task_id(rec()) == task_id(rec(file="elsewhere.py"))  # the text names the task
    assert task_id(rec()) != task_id(rec(post=PY_POST + "\n"))


def test_file_and_instruction_defaults_and_bounds() -> None:
    no_file = record_task(rec(file=None, language="typescript"))
    assert isinstance(no_file, SrlTask) and no_file.file == "main.ts"
    deep = record_task(rec(file="d/" * 300 + "x.py"))
    assert isinstance(deep, SrlTask) and deep.file == "x.py"
    long = record_task(rec(instruction="word " * 2000))
    assert isinstance(long, SrlTask)
    assert len(long.instruction) == MAX_INSTRUCTION_CHARS and long.instruction.endswith("…")
    blank = record_task(rec(instruction="   "))
    assert isinstance(blank, SrlTask) and blank.instruction == "Make the change geo/area.py needs."


def test_records_that_make_no_task_are_counted_by_reason() -> None:
    records = [
        rec(),
        rec(post=PY_PRE),  # no edit
        rec(language="go", file="main.go"),
        rec(pre="x" * (MAX_FILE_CHARS + 1)),
        rec(instruction="Broken", tags=["commitpackft", PARSE_FAILED_TAG]),
        rec(file="copy.py"),  # the same text as the first: the same id
        rec(instruction="Arrow", language="javascript", tags=["agentpack", "fragment"]),
    ]
    made = tasks_from_records(records)
    assert [t.instruction for t in made.tasks] == ["Use math.pi", "Arrow"]
    assert made.refused == {
        "no_edit": 1,
        "language": 1,
        "too_large": 1,
        "parse_failed": 1,
        "duplicate": 1,
    }
    assert set(made.refused) == set(REFUSALS) and made.read == len(records)
    assert made.by_dataset == {"commitpackft": 1, "agentpack": 1}
    kept = tasks_from_records(records, keep_parse_failed=True, limit=2)
    assert [t.instruction for t in kept.tasks] == ["Use math.pi", "Broken"]
    assert kept.read == 5  # stopped at the limit: the rest were not read


def test_a_task_must_be_an_edit_and_may_lack_a_gold_action() -> None:
    line = record_task(rec())
    assert isinstance(line, SrlTask)
    with pytest.raises(ValidationError, match="post equals pre"):
        SrlTask.model_validate({**line.model_dump(), "post": PY_PRE})
    with pytest.raises(TasksInvalid, match=r"line 1: .*post equals pre"):
        parse_tasks(line.model_copy(update={"post": PY_PRE}).model_dump_json().encode())


def _processed(root: Path, group: str, split: str, records: list[NormalizedRecord]) -> None:
    path = root / "processed" / group / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))


def test_write_tasks_reads_the_chosen_splits_and_names_unconfirmed_layouts(
    tmp_path: Path,
) -> None:
    for group in ("python", "javascript", "java"):
        for split in ("train", "dev", "test"):
            _processed(tmp_path, group, split, [])
    _processed(tmp_path, "python", "train", [rec(), rec(post=PY_PRE)])
    _processed(tmp_path, "javascript", "dev", [rec(language="typescript", tags=["agentpack"])])
    dest = tmp_path / "out" / "tasks.jsonl"
    result = write_tasks(tmp_path, dest, splits=["train", "dev"])
    tasks = parse_tasks(dest.read_bytes())
    assert [(t.language, t.gold_action) for t in tasks] == [
        ("python", None),
        ("typescript", None),
    ]
    assert (result.tasks, result.read, result.refused["no_edit"]) == (2, 3, 1)
    assert result.by_language == {"python": 1, "typescript": 1}
    assert result.unconfirmed == ["agentpack"] and result.gold_actions is False
    assert len(result.sources) == 6
    only = write_tasks(tmp_path, dest, groups=["python"], splits=["test"])
    assert only.tasks == 0 and dest.read_bytes() == b""
    with pytest.raises(DataError, match="unknown group rust"):
        write_tasks(tmp_path, dest, groups=["rust"])
    with pytest.raises(DataError, match="srl data process"):
        write_tasks(tmp_path / "empty", dest)
