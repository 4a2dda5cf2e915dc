"""How many tasks' prompts fit each configured model (``srl tasks``, ``srl synth``;
docs/srl-collect.md "Prompts that fit").

For every model of ``configs/models.yaml`` with a ``context_length``, each task's first
step is rendered as an episode sends it (the prompt pack, the goal as the state, the
whole file; the JSON form's system text where the model decodes against a schema),
counted with the model's tokenizer (:mod:`activities.srl.tokens`) and fitted into the
context less the completion budget (:func:`keel.srl.fit.fit_prompt`): ``whole`` tasks
fit as they are, ``cut`` ones fit once their code is cut, ``unfit`` ones cannot fit at
all (an episode of theirs would fail: only when the prompt pack alone is too long).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from activities.srl.tokens import PromptTokenizer, tokenizer_for
from keel.llm import ModelsConfig
from keel.srl.fit import PromptFit, fit_prompt, focus_line
from keel.srl.prompts import PromptPack, parse_prompt_pack, step_messages
from keel.srl.state import State, merge, render
from keel.srl.steps import base_name, goal_update

#: ``srl collect``'s default ``--max-tokens``: the completion budget the counts assume.
DEFAULT_COMPLETION_TOKENS = 512


class TaskLike(Protocol):
    """What fitting reads of a task (``keel.srl.tasks.SrlTask`` and the synthetic ones)."""

    @property
    def instruction(self) -> str:
        """The task's instruction, as the prompt states it."""

    @property
    def language(self) -> str:
        """The code's language (ast-grep's name for it)."""

    @property
    def file(self) -> str:
        """The path of the file the task edits."""

    @property
    def pre(self) -> str:
        """The file before the refactoring."""

    @property
    def post(self) -> str:
        """The file after it."""


class ModelFit(BaseModel):
    """One model's counts over a task file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    context_length: int
    max_tokens: int
    tokenizer: str
    exact: bool
    tasks: int
    whole: int
    cut: int
    unfit: int

    def line(self) -> str:
        how = "" if self.exact else " (no tokenizer: estimated at 1 token per 3 bytes)"
        return (
            f"fit {self.model} ({self.context_length} tokens, max_tokens {self.max_tokens}, "
            f"{self.tokenizer}{how}): {self.whole + self.cut} of {self.tasks} "
            f"({self.whole} whole, {self.cut} with code cut), {self.unfit} do not fit"
        )


def fit_task(
    task: TaskLike,
    pack: PromptPack,
    tokenizer: PromptTokenizer,
    *,
    budget: int,
    structured: bool,
) -> PromptFit:
    """The first step's prompt of ``task`` fitted into ``budget`` tokens."""
    state = render(merge(State(), goal_update(task.instruction)))
    messages_for = step_messages(
        pack, language=task.language, file=base_name(task.file), state=state, structured=structured
    )
    return fit_prompt(
        messages_for,
        code=task.pre,
        instruction=task.instruction,
        language=task.language,
        count=tokenizer.count_messages,
        budget=budget,
        focus=focus_line(task.pre, task.post),
    )


def model_fits(
    tasks: Iterable[TaskLike],
    models: ModelsConfig,
    prompts_path: Path,
    *,
    max_tokens: int = DEFAULT_COMPLETION_TOKENS,
) -> list[ModelFit]:
    """The counts for every configured model with a ``context_length``."""
    pack = parse_prompt_pack(prompts_path.read_text(encoding="utf-8"))
    all_tasks = list(tasks)
    out: list[ModelFit] = []
    for name, spec in sorted(models.models.items()):
        if spec.context_length is None:
            continue
        tokenizer = tokenizer_for(spec)
        budget = spec.context_length - max_tokens
        whole = cut = unfit = 0
        for task in all_tasks:
            fit = fit_task(
                task,
                pack,
                tokenizer,
                budget=budget,
                structured=spec.structured_output != "none",
            )
            if not fit.fits:
                unfit += 1
            elif fit.cut:
                cut += 1
            else:
                whole += 1
        out.append(
            ModelFit(
                model=name,
                context_length=spec.context_length,
                max_tokens=max_tokens,
                tokenizer=tokenizer.name,
                exact=tokenizer.exact,
                tasks=len(all_tasks),
                whole=whole,
                cut=cut,
                unfit=unfit,
            )
        )
    return out


def configured_fits(
    tasks: Iterable[TaskLike], *, max_tokens: int = DEFAULT_COMPLETION_TOKENS
) -> list[ModelFit]:
    """:func:`model_fits` for this machine's models config and prompt pack (settings:
    ``KEEL_MODELS_CONFIG``, ``KEEL_SRL_PROMPTS``)."""
    from keel.settings import get_settings
    from store.files import load_models_config

    settings = get_settings()
    models = load_models_config(settings.models_config)
    return model_fits(tasks, models, settings.srl_prompts, max_tokens=max_tokens)
