"""The trainer's view of a step record: TRL's conversational columns (``messages``,
``prompt``, ``completion``) and the reward columns, as plain values (docs/srl-export.md).

The chat is the one the step sent: the record's ``prompt.messages`` are what
``keel.srl.prompts.render_messages`` returned and what the teacher or the actor was sent
(the gold replay renders the same chat and sends it to no one). The completion is the
recorded answer, but for a gold replay: its recorded think text is a constant
(``keel.srl.prompts.gold_answer``), so the export gives it the expert's reasoning where
the expert set has it (the think of the teacher step that became the expert's step), else
a think text derived from the task's instruction and the expert's action.

Pure: a decoded record and the task (when known) come in, column values go out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from keel.srl.steps import SrlTask

#: Where a row's completion think text comes from.
ThinkSource = Literal["model", "expert", "instruction"]

#: The columns :func:`trainer_columns` fills, in order.
TRAINER_COLUMNS: Final = (
    "messages",
    "prompt",
    "completion",
    "prompt_json",
    "think",
    "think_source",
    "reward",
    "tests_passed",
    "tests_passed_fraction",
    "text_similarity",
    "logprobs",
    "token_ids",
)

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_MAX_THINK_CHARS: Final = 4000


def chat_sent(record: Mapping[str, Any]) -> list[dict[str, str]] | None:
    """The chat the step sent (system, user …) as ``{role, content}`` messages; ``None``
    for a record without one."""
    prompt = record.get("prompt") or {}
    messages = prompt.get("messages") if isinstance(prompt, Mapping) else None
    if not isinstance(messages, list) or not messages:
        return None
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


def derived_think(instruction: str, step: int, action: Mapping[str, Any] | None) -> str:
    """A gold step's think text when the expert set has no reasoning: what the task asks
    (its instruction) and how the expert's action does it. It differs from task to task
    (never a constant monologue)."""
    goal = " ".join(instruction.split())
    lines = [f"Step {step}. The task: {goal}"]
    if action and action.get("pattern") is not None:
        lines.append(
            f"The code to change matches `{action['pattern']}`; rewriting each match as "
            f"`{action.get('rewrite', '')}` makes the change and leaves the rest of the "
            f"{action.get('language', 'file')} file as it is."
        )
    elif action:
        lines.append(
            f"An ast-grep rule over the {action.get('language', 'source')} file finds the "
            "code to change, and its fix makes the change where the rule matches."
        )
    return "\n".join(lines)[:_MAX_THINK_CHARS]


def gold_think(
    record: Mapping[str, Any], task: SrlTask | None
) -> tuple[str, Literal["expert", "instruction"]]:
    """The think text of a gold-replay step: the expert's reasoning for this step where
    the task's expert set has it (``ExpertStep.think``), else :func:`derived_think` from
    the task's instruction (the task file's, else the goal the record's state starts
    from)."""
    step = int(record.get("step") or 1)
    if task is not None and task.expert is not None:
        at = task.expert.steps[min(step, len(task.expert.steps)) - 1]
        if at.think and at.think.strip():
            return at.think.strip()[:_MAX_THINK_CHARS], "expert"
    if task is not None:
        instruction = task.instruction
    else:
        goals = (record.get("state_before") or {}).get("goals") or [""]
        instruction = str(goals[0])
    return derived_think(instruction, step, record.get("expert_action")), "instruction"


def with_think(raw: str, think: str) -> str:
    """``raw`` with its first ``<think>…</think>`` block's text replaced by ``think``
    (put in front when it has none)."""
    think = think.replace("</think>", "</ think>")
    block = f"<think>{think}</think>"
    if _THINK.search(raw):
        return _THINK.sub(lambda _: block, raw, count=1)
    return block + raw


def all_tests_passed(fraction: float | None) -> bool | None:
    """``tests_passed`` as a trainer reads it: ``None`` where the task has no tests, else
    whether every test passed."""
    return None if fraction is None else fraction >= 1.0


def trainer_columns(
    record: Mapping[str, Any], *, source: str, task: SrlTask | None = None
) -> dict[str, Any]:
    """The step's :data:`TRAINER_COLUMNS` (TRL's conversational format and the rewards).

    ``messages`` is the chat sent and then the assistant's answer; ``prompt`` the chat
    sent and ``completion`` ``[answer]`` (TRL's prompt-completion form). ``prompt_json`` is
    the record's whole ``prompt`` (messages, step, state tokens) as JSON text, what the
    ``prompt`` column held before. ``think`` is the completion's think text and
    ``think_source`` where it came from: ``model`` (the answer's own), ``expert`` or
    ``instruction`` (gold replay, :func:`gold_think`).
    """
    out = record.get("model_output") or {}
    reward = record.get("reward") or {}
    raw = str(out.get("raw") or "")
    think = str(out.get("think") or "")
    think_source: ThinkSource = "model"
    if source == "gold_replay":
        think, think_source = gold_think(record, task)
        raw = with_think(raw, think)
    prompt = chat_sent(record)
    completion = [{"role": "assistant", "content": raw}]
    tests = reward.get("tests_passed")
    raw_prompt = record.get("prompt")
    return {
        "messages": None if prompt is None else [*prompt, *completion],
        "prompt": prompt,
        "completion": completion,
        "prompt_json": (
            None
            if raw_prompt is None
            else json.dumps(raw_prompt, sort_keys=True, ensure_ascii=False)
        ),
        "think": think,
        "think_source": think_source,
        "reward": reward.get("total"),
        "tests_passed": all_tests_passed(tests),
        "tests_passed_fraction": tests,
        "text_similarity": reward.get("text_similarity"),
        "logprobs": out.get("logprobs"),
        "token_ids": out.get("token_ids"),
    }
