"""A synthetic refactoring task: the source file it is made from, the task with its gold
action and expected post-text, and :func:`_task`, which every template ends with (it
refuses an instruction that leaks the pattern and attaches the checks)."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from keel.srl.checks import Check, TaskTest, check_tests, synth_tests
from keel.srl.datasets import Spdx
from keel.srl.errors import InstructionLeak, TemplateNotApplicable
from keel.srl.intent import instruction_leaks
from keel.srl.step import Language, PatternAction


class SourceFile(BaseModel):
    """A source file as shipped in a registry package, with its licence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[str, StringConstraints(min_length=1)]
    text: str
    license: Spdx
    language: Language
    package: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


class SynthTask(BaseModel):
    """One synthetic task: the file before, the gold action and the expected file after."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    template: str
    instruction: str
    language: Language
    file: str
    package: str
    license: str
    source_sha256: str
    seed: int
    pre: str
    post: str
    gold_action: PatternAction
    tags: list[str]
    #: Checks that hold on ``pre`` and ``post`` (keel.srl.checks.synth_tests); empty for
    #: a template with no meaningful check, and in task files written before tests.
    tests: list[TaskTest] = Field(default_factory=list)

    @field_validator("tests")
    @classmethod
    def _tests(cls, value: list[TaskTest]) -> list[TaskTest]:
        check_tests(value)
        return value


Edit = tuple[int, int, str]
Template = Callable[[SourceFile, int], SynthTask]


def _apply(text: str, edits: list[Edit]) -> str:
    edits = sorted(edits)
    for (_, prev_end, _), (start, _, _) in itertools.pairwise(edits):
        if start < prev_end:
            raise TemplateNotApplicable("overlapping matches")
    out = text
    for start, end, replacement in reversed(edits):
        out = out[:start] + replacement + out[end:]
    return out


def _task(
    source: SourceFile,
    template: str,
    seed: int,
    instruction: str,
    pattern: str,
    rewrite: str,
    post: str,
    checks: Sequence[Check] = (),
) -> SynthTask:
    if post == source.text:
        raise TemplateNotApplicable("the rewrite changes nothing")
    digest = hashlib.sha256(
        f"{source.sha256}\0{template}\0{pattern}\0{rewrite}".encode()
    ).hexdigest()
    task_id = f"{source.language}-{template.replace('_', '-')}-{digest[:16]}"
    leaks = instruction_leaks(instruction, [{"pattern": pattern, "rewrite": rewrite}], source.text)
    if leaks:
        raise InstructionLeak(task_id, leaks)
    return SynthTask(
        task_id=task_id,
        template=template,
        instruction=instruction,
        language=source.language,
        file=source.path,
        package=source.package,
        license=source.license,
        source_sha256=source.sha256,
        seed=seed,
        pre=source.text,
        post=post,
        gold_action=PatternAction(pattern=pattern, rewrite=rewrite, language=source.language),
        tags=["synthetic", template],
        tests=synth_tests(checks, source.text, post),
    )


def _pick(candidates: Iterable[str], seed: int) -> str:
    ordered = sorted(set(candidates))
    if not ordered:
        raise TemplateNotApplicable("no candidate in this file")
    return random.Random(seed).choice(ordered)
