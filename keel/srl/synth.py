"""Synthetic refactoring tasks from templates over real, permissively licensed source files.

Each template is a pure function ``(source, seed) -> SynthTask``: it picks a target in the
file (the seed decides among candidates), writes the gold action as an ast-grep
``{pattern, rewrite, language}`` and computes the expected post-text with a reference
transformation written here in Python (``ast`` and ``tokenize`` for Python, a small lexer
for JavaScript, TypeScript and Java). A template refuses a file
(:class:`TemplateNotApplicable`) whenever it cannot be sure its reference transformation
does what ast-grep will do: multi-line matches, trailing commas, nested matches,
f-strings holding the target, and the like.

The reference is a prediction, not proof: the sandbox activity applies every gold action
with real ast-grep and keeps only tasks whose result equals the expected post-text and
re-parses.

The task model and its checks are in :mod:`keel.srl.synth_task`, the Python templates in
:mod:`keel.srl.synth_python`, the JavaScript/TypeScript/Java ones (and their lexer) in
:mod:`keel.srl.synth_clike`; this module holds the table of templates and
:func:`synthesise`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from keel.srl.errors import TemplateNotApplicable
from keel.srl.step import Language
from keel.srl.synth_clike import c_like_identifiers, c_like_rename
from keel.srl.synth_python import (
    py_add_guard,
    py_dict_get_default,
    py_none_comparison,
    py_rename,
    py_replace_api,
    py_swap_arguments,
    py_wrap_call,
)
from keel.srl.synth_task import SourceFile, SynthTask, Template

TEMPLATES: dict[Language, dict[str, Template]] = {
    "python": {
        "rename": py_rename,
        "wrap_call": py_wrap_call,
        "add_guard": py_add_guard,
        "replace_api": py_replace_api,
        "swap_arguments": py_swap_arguments,
        "none_comparison": py_none_comparison,
        "dict_get_default": py_dict_get_default,
    },
    "javascript": {"rename": c_like_rename},
    "typescript": {"rename": c_like_rename},
    "java": {"rename": c_like_rename},
}


class SynthReport(BaseModel):
    """Tasks made and, per template, how many files it refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[SynthTask]
    refused: dict[str, int]


def synthesise(sources: Iterable[SourceFile], seeds: Sequence[int] = (0,)) -> SynthReport:
    """Run every template of each file's language once per seed; the same inputs give the
    same tasks in the same order.

    Another seed may pick another target in the same file; a task found again (same id)
    is kept once. ``refused`` counts (file, seed) pairs a template could not use.
    """
    tasks: dict[str, SynthTask] = {}
    refused: dict[str, int] = {}
    for source in sources:
        for name, template in TEMPLATES[source.language].items():
            for seed in seeds:
                try:
                    task = template(source, seed)
                except TemplateNotApplicable:
                    refused[name] = refused.get(name, 0) + 1
                    continue
                tasks.setdefault(task.task_id, task)
    return SynthReport(tasks=list(tasks.values()), refused=refused)


__all__ = [
    "TEMPLATES",
    "SourceFile",
    "SynthReport",
    "SynthTask",
    "c_like_identifiers",
    "c_like_rename",
    "py_add_guard",
    "py_dict_get_default",
    "py_none_comparison",
    "py_rename",
    "py_replace_api",
    "py_swap_arguments",
    "py_wrap_call",
    "synthesise",
]
