"""The step prompt: the teacher/actor prompt pack (configs/teacher_prompts.yaml) rendered
with a task, the file as it is now and the state; and the gold replay's answer.

Pure: the pack's YAML text comes in as a string and messages go out as plain dicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from string import Formatter
from typing import Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from keel.problems import problems
from keel.srl.fit import cut_marker
from keel.srl.step import PatternAction, RuleAction, action_text

#: Placeholders a user template may use (anything else is refused when the pack loads).
FIELDS: Final = ("instruction", "language", "file", "code", "state")
MAX_CODE_CHARS: Final = 24_000


class PromptPackInvalid(ValueError):
    """configs/teacher_prompts.yaml is not a valid prompt pack."""


class PromptPack(BaseModel):
    """A system prompt and a user template with ``{instruction}``, ``{language}``,
    ``{file}``, ``{code}`` and ``{state}``.

    ``system`` asks for the tag form; ``system_structured`` (optional) replaces it when
    the model's server decodes against the step's JSON Schema (the JSON form), so the
    prompt describes the answer the schema allows.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = Field(min_length=1, max_length=20_000)
    system_structured: str | None = Field(default=None, min_length=1, max_length=20_000)
    user: str = Field(min_length=1, max_length=20_000)

    @field_validator("user")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        names = {name for _, name, _, _ in Formatter().parse(value) if name is not None}
        unknown = sorted(names - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown placeholders {unknown}; allowed: {list(FIELDS)}")
        if "code" not in names:
            raise ValueError("the user template must show the code: add {code}")
        return value


def parse_prompt_pack(text: str) -> PromptPack:
    """Parse the YAML prompt pack; ``PromptPackInvalid`` says what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PromptPackInvalid(f"not YAML: {e}") from None
    try:
        return PromptPack.model_validate(data)
    except ValidationError as e:
        raise PromptPackInvalid(problems(e, root="pack")) from None


def render_messages(
    pack: PromptPack,
    *,
    instruction: str,
    language: str,
    file: str,
    code: str,
    state: str,
    structured: bool = False,
) -> list[dict[str, str]]:
    """The chat messages of one step. Code over ``MAX_CODE_CHARS`` is cut at the last
    line boundary before it, with a comment line in the task's language saying how many
    lines were cut (``keel.srl.fit`` cuts to the model's context before this).
    ``structured``: the answer is the JSON form, so the pack's ``system_structured``
    (when it has one) is the system prompt."""
    if len(code) > MAX_CODE_CHARS:
        head = code[: code.rfind("\n", 0, MAX_CODE_CHARS) + 1]
        cut = code[len(head) :].count("\n") + (0 if code.endswith("\n") else 1)
        code = head + cut_marker(language, cut, "below")
    user = pack.user.format(
        instruction=instruction, language=language, file=file, code=code, state=state
    )
    system = pack.system_structured if structured and pack.system_structured else pack.system
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def step_messages(
    pack: PromptPack, *, language: str, file: str, state: str, structured: bool
) -> Callable[[str, str], list[dict[str, str]]]:
    """:func:`render_messages` of one step as a function of its code and instruction, the
    two parts ``keel.srl.fit.fit_prompt`` may cut: what the episode sends and what
    ``srl tasks``/``srl synth`` count."""

    def messages(code: str, instruction: str) -> list[dict[str, str]]:
        return render_messages(
            pack,
            instruction=instruction,
            language=language,
            file=file,
            code=code,
            state=state,
            structured=structured,
        )

    return messages


def gold_answer(action: PatternAction | RuleAction, instruction: str) -> str:
    """The answer a gold replay gives: the expert action in the answer format, so it goes
    through the same parser, sandbox and rewards as a model's."""
    update = {"decisions": [f"apply the expert rewrite for: {instruction}"[:256]]}
    return (
        f"<think>Expert action for this task.</think>"
        f"<action>{action_text(action)}</action>"
        f"<state_update>{json.dumps(update, ensure_ascii=False)}</state_update>"
    )
