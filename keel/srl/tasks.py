"""Collection tasks from processed dataset records (``srl tasks``, docs/srl-data.md).

A processed record (:class:`keel.srl.datasets.NormalizedRecord`) has the instruction,
the pre- and post-text, the language and, where its dataset names one, the file; it has
no expert action. :func:`tasks_from_records` turns records into :class:`SrlTask` lines
without a ``gold_action`` and counts, by reason, the records it cannot use. Pure: the
caller reads the processed files and writes the task file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Final, Literal, get_args

import blake3
from pydantic import BaseModel, ConfigDict

from keel.digest import canonical_json
from keel.srl.datasets import PARSE_FAILED_TAG, NormalizedRecord
from keel.srl.step import LANGUAGES, Language
from keel.srl.steps import MAX_FILE_CHARS, SrlTask

#: Why a record made no task: ``no_edit`` (post equals pre), ``language`` (not one the
#: sandbox edits), ``too_large`` (pre or post over ``MAX_FILE_CHARS``), ``parse_failed``
#: (tagged by ``srl data process``; kept only on request), ``duplicate`` (a record with
#: the same id, that is the same text, came first).
Refusal = Literal["no_edit", "language", "too_large", "parse_failed", "duplicate"]
REFUSALS: Final[tuple[Refusal, ...]] = get_args(Refusal)

MAX_INSTRUCTION_CHARS: Final = 4000  # SrlTask.instruction's bound
MAX_FILE_NAME_CHARS: Final = 512  # SrlTask.file's bound
_ID_DIGEST_CHARS: Final = 16
# The file a task names when its record names none: the language's usual extension.
DEFAULT_FILES: Final[dict[Language, str]] = {
    "python": "main.py",
    "javascript": "main.js",
    "typescript": "main.ts",
    "java": "Main.java",
}


class TasksFromRecords(BaseModel):
    """The tasks made, in record order; the records refused, by reason; and the tasks
    per dataset (a record's first tag)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[SrlTask]
    refused: dict[Refusal, int]
    by_dataset: dict[str, int]

    @property
    def read(self) -> int:
        return len(self.tasks) + sum(self.refused.values())


def task_id(record: NormalizedRecord) -> str:
    """``<dataset>-<16 hex digits>``: the dataset (the record's first tag) and a BLAKE3
    digest of the record's text, so the same record always gets the same id and the id
    fits ``check_id`` (``[A-Za-z0-9._-]``, at most 128 characters)."""
    dataset = re.sub(r"[^A-Za-z0-9._-]", "-", record.tags[0] if record.tags else "")[:64]
    digest = blake3.blake3(
        canonical_json([record.instruction, record.pre, record.post, record.language])
    ).hexdigest()[:_ID_DIGEST_CHARS]
    return f"{dataset or 'record'}-{digest}"


def task_file(record: NormalizedRecord, language: Language) -> str:
    """The record's file (its base name when the path is over the bound), else the
    language's :data:`DEFAULT_FILES` name."""
    path = (record.file or "").strip()
    if not path:
        return DEFAULT_FILES[language]
    if len(path) > MAX_FILE_NAME_CHARS:
        path = path.replace("\\", "/").rsplit("/", 1)[-1][-MAX_FILE_NAME_CHARS:]
    return path or DEFAULT_FILES[language]


def task_instruction(record: NormalizedRecord, file: str) -> str:
    """The record's instruction (its commit message or the dataset's instruction), cut to
    :data:`MAX_INSTRUCTION_CHARS`; a blank one becomes a default naming the file."""
    text = record.instruction.strip()
    if not text:
        return f"Make the change {file} needs."
    if len(text) > MAX_INSTRUCTION_CHARS:
        text = text[: MAX_INSTRUCTION_CHARS - 1].rstrip() + "…"
    return text


def record_task(record: NormalizedRecord, *, keep_parse_failed: bool = False) -> SrlTask | Refusal:
    """The task of one record, or why there is none."""
    if record.pre == record.post:
        return "no_edit"
    if record.language not in LANGUAGES:
        return "language"
    language: Language = record.language  # type: ignore[assignment]  # checked just above
    if len(record.pre) > MAX_FILE_CHARS or len(record.post) > MAX_FILE_CHARS:
        return "too_large"
    if PARSE_FAILED_TAG in record.tags and not keep_parse_failed:
        return "parse_failed"
    file = task_file(record, language)
    return SrlTask(
        task_id=task_id(record),
        instruction=task_instruction(record, file),
        language=language,
        file=file,
        pre=record.pre,
        post=record.post,
    )


def tasks_from_records(
    records: Iterable[NormalizedRecord],
    *,
    keep_parse_failed: bool = False,
    limit: int | None = None,
) -> TasksFromRecords:
    """Tasks from ``records`` in order, at most ``limit`` of them; every record read
    before the limit is reached is either a task or counted in ``refused``."""
    tasks: list[SrlTask] = []
    refused: Counter[Refusal] = Counter()
    seen: set[str] = set()
    by_dataset: Counter[str] = Counter()
    for record in records:
        if limit is not None and len(tasks) >= limit:
            break
        made = record_task(record, keep_parse_failed=keep_parse_failed)
        if isinstance(made, str):
            refused[made] += 1
        elif made.task_id in seen:
            refused["duplicate"] += 1
        else:
            seen.add(made.task_id)
            tasks.append(made)
            by_dataset[record.tags[0] if record.tags else "record"] += 1
    return TasksFromRecords(
        tasks=tasks, refused={r: refused[r] for r in REFUSALS}, by_dataset=dict(by_dataset)
    )
