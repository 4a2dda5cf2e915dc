"""Prompts that fit the model's context (issue 39 §5).

A step's prompt (system, state, instruction and the file) plus the completion budget
(``max_tokens``) must fit the serving model's context window, or the server refuses the
request and the episode has no answer. :func:`fit_prompt` keeps the prompt inside
``context_length - max_tokens`` tokens by cutting the file's code, never the step:

1. the whole file when the whole prompt fits;
2. else a window of whole top-level statements (:func:`top_level_chunks`: lines that
   start at column 0, with the decorators and comments just above them), grown from the
   statement holding the code to change (the first line where the file differs from
   the goal) alternately downwards and upwards, as many as fit;
3. else (one statement is too long by itself) a window of whole lines around that line;
4. else (even no code fits) the instruction is shortened at a word boundary.

Each cut is marked by one comment line in the task's language (:func:`comment_marker`:
``#`` for Python, ``//`` for JavaScript, TypeScript, Java …) saying how many lines were
cut, so the model knows the file goes on. A prompt that cannot fit even with no code and
no instruction (the system text and the state alone are over the budget: the model's
context is too small for the prompt pack) comes back with ``fits`` false.

Pure: tokens are counted by a callable over the chat messages (the serving model's
tokenizer with its chat template where there is one), and the messages are rendered by
a callable of the code and the instruction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pydantic import BaseModel, ConfigDict

Messages = list[dict[str, str]]
#: Tokens of a whole prompt (the chat messages as the server will tokenize them).
MessageCounter = Callable[[Messages], int]
#: The step's messages for a code text and an instruction.
Renderer = Callable[[str, str], Messages]

#: The line-comment marker per language (ast-grep's language names and aliases).
COMMENT_MARKERS: Final[dict[str, str]] = {
    "python": "#",
    "py": "#",
    "ruby": "#",
    "bash": "#",
    "shell": "#",
    "yaml": "#",
    "javascript": "//",
    "js": "//",
    "jsx": "//",
    "typescript": "//",
    "ts": "//",
    "tsx": "//",
    "java": "//",
    "go": "//",
    "rust": "//",
    "c": "//",
    "cpp": "//",
    "csharp": "//",
    "kotlin": "//",
    "scala": "//",
    "swift": "//",
    "dart": "//",
    "php": "//",
    "lua": "--",
    "sql": "--",
    "haskell": "--",
    "elixir": "#",
    "html": "<!--",
    "css": "/*",
}
_CLOSERS: Final = {"<!--": " -->", "/*": " */"}
#: Python lines at column 0 that continue the statement above, not start a new one.
_CONTINUATIONS: Final = ("else", "elif", "except", "finally", "case")


def comment_marker(language: str) -> str:
    """The line-comment marker of ``language`` (``#`` where unknown)."""
    return COMMENT_MARKERS.get(language.lower(), "#")


def cut_marker(language: str, lines: int, where: str) -> str:
    """One comment line in the task's language saying ``lines`` lines were cut ``where``
    (``above`` or ``below``), newline included."""
    marker = comment_marker(language)
    noun = "line" if lines == 1 else "lines"
    text = f"{marker} [{lines} {noun} {where} cut to fit the model's context]"
    return text + _CLOSERS.get(marker, "") + "\n"


def top_level_chunks(lines: list[str], language: str) -> list[tuple[int, int]]:
    """The file's top-level statements as half-open line ranges covering every line.

    A statement starts at a line that begins at column 0 with something other than a
    closing bracket (or, in Python, ``else``/``elif``/``except``/``finally``), unless the
    line above it (blank lines aside) is a column-0 decorator or comment, which belongs
    to it. Blank and indented lines stay with the statement above. Approximate (a column-0
    line inside a multi-line string starts a statement), which is still a line boundary.
    """
    python = comment_marker(language) == "#"
    starts: list[int] = []
    attached = False  # the last non-blank column-0 line was a decorator or comment
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or line[0] in " \t":
            if stripped:
                attached = False
            continue
        if stripped[0] in ")]}" or (
            python and stripped.split(None, 1)[0].rstrip(":") in _CONTINUATIONS
        ):
            attached = False
            continue
        if not attached:
            starts.append(i)
        attached = stripped.startswith(("@", "#", "//", "/*", "*"))
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    ends = [*starts[1:], len(lines)]
    return list(zip(starts, ends, strict=True))


def focus_line(text: str, goal: str) -> int:
    """The first line (0-based) where ``text`` differs from ``goal``: the code to change.
    0 when they are equal."""
    a, b = text.splitlines(), goal.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else 0


class PromptFit(BaseModel):
    """The messages to send and how they were made to fit.

    ``prompt_tokens`` is the count of ``messages``; ``budget`` the tokens the prompt may
    take (context length less the completion budget). ``lines_cut_above`` and
    ``lines_cut_below`` say how many lines of the file the prompt leaves out (0 and 0:
    the whole file); ``instruction_cut``, whether the instruction was shortened.
    ``fits`` is false only when nothing could be cut enough (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, str]]
    prompt_tokens: int
    budget: int
    fits: bool
    lines_total: int
    lines_cut_above: int = 0
    lines_cut_below: int = 0
    instruction_cut: bool = False

    @property
    def cut(self) -> bool:
        return bool(self.lines_cut_above or self.lines_cut_below or self.instruction_cut)


def _window(lines: list[str], start: int, end: int, language: str) -> str:
    head = cut_marker(language, start, "above") if start > 0 else ""
    body = "".join(lines[start:end])
    if body and not body.endswith("\n"):
        body += "\n"
    tail = cut_marker(language, len(lines) - end, "below") if end < len(lines) else ""
    return head + body + tail


def _growth(units: list[tuple[int, int]], focus: int) -> list[tuple[int, int]]:
    """Windows of 1, 2, … units (as line ranges), grown from the unit holding line
    ``focus`` alternately downwards and upwards; each window holds the one before."""
    at = next((i for i, (a, b) in enumerate(units) if a <= focus < b), 0)
    lo, hi = at, at + 1
    out = [(units[lo][0], units[hi - 1][1])]
    down = True
    while lo > 0 or hi < len(units):
        if (down and hi < len(units)) or lo == 0:
            hi += 1
        else:
            lo -= 1
        down = not down
        out.append((units[lo][0], units[hi - 1][1]))
    return out


def _largest(windows: list[tuple[int, int]], fits: Callable[[tuple[int, int]], bool]) -> int:
    """The index of the largest window that fits (windows grow), or -1: binary search."""
    lo, hi = -1, len(windows) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(windows[mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shorter(text: str, chars: int) -> str:
    cut = text[:chars]
    space = cut.rfind(" ")
    if space > chars // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"


def _most_chars(length: int, fits: Callable[[int], bool]) -> int:
    """The most characters (up to ``length``) for which ``fits`` holds, by bisection
    (``fits`` falls as characters grow); -1 when not even 0 fits."""
    lo, hi = -1, length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_prompt(
    render: Renderer,
    *,
    code: str,
    instruction: str,
    language: str,
    count: MessageCounter,
    budget: int,
    focus: int = 0,
) -> PromptFit:
    """The step's messages within ``budget`` tokens (module doc: the order of cuts).

    ``render(code, instruction)`` gives the messages; ``count(messages)`` their tokens;
    ``focus`` is the line the window is grown from (:func:`focus_line`)."""
    lines = code.splitlines(keepends=True)
    total = len(lines)

    def result(start: int, end: int, instr: str, *, fits: bool = True) -> PromptFit:
        text = code if (start, end) == (0, total) else _window(lines, start, end, language)
        messages = render(text, instr)
        return PromptFit(
            messages=messages,
            prompt_tokens=count(messages),
            budget=budget,
            fits=fits,
            lines_total=total,
            lines_cut_above=start,
            lines_cut_below=total - end,
            instruction_cut=instr != instruction,
        )

    whole = result(0, total, instruction)
    if whole.prompt_tokens <= budget or total == 0:
        return whole.model_copy(update={"fits": whole.prompt_tokens <= budget})

    def fits(window: tuple[int, int]) -> bool:
        return count(render(_window(lines, *window, language), instruction)) <= budget

    focus = min(max(focus, 0), total - 1)
    for units in (top_level_chunks(lines, language), [(i, i + 1) for i in range(total)]):
        windows = _growth(units, focus)
        best = _largest(windows, fits)
        if best >= 0:
            return result(*windows[best], instruction)
    # No line fits beside the instruction: no code, and the instruction shortened.
    empty = (focus, focus)

    def fits_instruction(chars: int) -> bool:
        text = _shorter(instruction, chars) if chars < len(instruction) else instruction
        return count(render(_window(lines, *empty, language), text)) <= budget

    lo = _most_chars(len(instruction), fits_instruction)
    if lo < 0:
        return result(*empty, _shorter(instruction, 0), fits=False)
    return result(*empty, _shorter(instruction, lo) if lo < len(instruction) else instruction)
