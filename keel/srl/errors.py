"""Errors of the SRL domain.

Each is a plain exception with structured fields, so an activity can turn it into a
non-retryable ``ApplicationError`` with the same fields as details, and an episode can
record a malformed answer as a step instead of crashing.
"""

from __future__ import annotations


class SrlError(Exception):
    """Base class of every SRL domain error."""


class StateUpdateInvalid(SrlError, ValueError):
    """A ``<state_update>`` (or a stored state) does not validate.

    ``fields`` names every offending field as a dotted path (``history.3``), so the
    message a model sees back tells it exactly what to fix.
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        self.fields = [field for field, _ in problems]
        lines = [f"{field or '<root>'}: {message}" for field, message in problems]
        super().__init__("invalid state update: " + "; ".join(lines))


class StepFormatError(SrlError, ValueError):
    """A model answer is not ``<think>…</think><action>…</action><state_update>…</state_update>``.

    ``kind`` is a stable code (see :data:`keel.srl.step.FORMAT_ERROR_KINDS`) for counting
    and reporting; ``detail`` says what exactly is wrong.
    """

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}")


class MalformedRecord(SrlError, ValueError):
    """One published dataset record cannot be normalised; ``line`` is 1-based."""

    def __init__(self, dataset: str, line: int, field: str, message: str) -> None:
        self.dataset = dataset
        self.line = line
        self.field = field
        self.message = message
        super().__init__(f"{dataset}: line {line}: {field}: {message}")


class ManifestMismatch(SrlError, ValueError):
    """A downloaded file's size or sha256 differs from the manifest, or it is not listed."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(f"{name}: {message}")


class TemplateNotApplicable(SrlError, ValueError):
    """A synthetic-task template finds nothing it can rewrite safely in a source file."""


class InstructionLeak(SrlError, ValueError):
    """A task's instruction gives its gold action away (``keel.srl.intent``): a template
    bug, not a file it cannot use, so never counted as a refusal."""

    def __init__(self, task_id: str, leaks: list[str]) -> None:
        self.task_id = task_id
        self.leaks = leaks
        super().__init__(
            f"task {task_id}: the instruction gives the gold action away ({'; '.join(leaks)})"
        )


class ActorsConfigError(SrlError, ValueError):
    """The actors config is not YAML or does not validate; the message names each bad key."""
