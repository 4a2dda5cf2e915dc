"""Token estimates and the ``max_context_window`` guard.

Keel cannot load each model's tokenizer in pure domain code (and the app may run on any
model), so it estimates: one token per 4 bytes of UTF-8, rounded up, plus a fixed
allowance for the chat template that wraps each message.

Why bytes rather than characters: "about 4 characters per token" holds for English
prose with GPT-style BPE vocabularies, but text in scripts outside ASCII (CJK, Cyrillic,
emoji) costs far more tokens per character. Counting UTF-8 bytes equals the character
rule for ASCII and grows with those scripts (a 3-byte CJK character counts 0.75 tokens
instead of 0.25), which keeps the estimate on the cautious side where the character rule
fails worst. It is still a heuristic: code and unusual tokenizers can exceed it, which is
why the guard compares against the app's declared window rather than a model's real
limit, and why the real usage reported by the provider is recorded after each call.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from keel.rllm.errors import ContextWindowExceededError

if TYPE_CHECKING:
    from keel.rllm.model import RllmProgram

BYTES_PER_TOKEN = 4
#: Role markers and special tokens a chat template adds around one message (generous for
#: ChatML-style templates, which add 4-6).
MESSAGE_OVERHEAD_TOKENS = 8


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: ``ceil(utf8_bytes / 4)``; 0 for the empty string."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def estimate_prompt_tokens(prompt: str) -> int:
    """Estimated tokens of ``prompt`` sent as one chat message (text plus overhead)."""
    return estimate_tokens(prompt) + MESSAGE_OVERHEAD_TOKENS


def check_context_window(prompt: str, max_context_window: int, max_tokens: int) -> int:
    """Check that ``prompt`` and ``max_tokens`` of answer fit in ``max_context_window``.

    Returns the estimated prompt tokens when they fit.

    Raises:
        ContextWindowExceededError: with the estimate, the reserved answer tokens, the
            window and the excess in ``details``.
    """
    prompt_tokens = estimate_prompt_tokens(prompt)
    needed = prompt_tokens + max_tokens
    if needed <= max_context_window:
        return prompt_tokens
    over = needed - max_context_window
    # Roughly how much of the prompt would have to go, so the hint is actionable.
    cut_chars = over * BYTES_PER_TOKEN
    raise ContextWindowExceededError(
        f"the prompt needs about {prompt_tokens} tokens and the answer may use {max_tokens}, "
        f"{needed} in all, but max_context_window is {max_context_window} "
        f"({over} tokens too many)",
        details={
            "estimated_prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "max_context_window": max_context_window,
            "needed_tokens": needed,
            "over_by_tokens": over,
            "prompt_bytes": len(prompt.encode("utf-8")),
            "estimator": f"ceil(utf8_bytes / {BYTES_PER_TOKEN}) + {MESSAGE_OVERHEAD_TOKENS}",
        },
        recovery_hint=(
            f"Shorten the input by about {cut_chars} characters (ASCII), lower "
            "llm_params.max_tokens, or raise max_context_window if the model's window is "
            "really larger."
        ),
    )


def prompt_tokens_for(program: RllmProgram, value: dict[str, Any]) -> int | None:
    """Estimated prompt tokens of the root app for an input (None without a model call).

    Pre-block outputs are not known before the run: each is taken to be as long as the
    block's inputs together (a cleaning block keeps the text's size). Child outputs read
    by the template are left out.
    """
    from keel.rllm.contracts import render_prompt, template_variables

    if not program.needs_llm:
        return None
    pre: dict[str, Any] = {}
    scope = dict(value)
    for block in program.pre_blocks:
        guess = " ".join(
            v if isinstance(v, str) else json.dumps(v)
            for n in block.inputs
            if (v := scope.get(n)) is not None
        )
        for out in block.outputs:
            pre[out] = guess
        scope.update(pre)
    return estimate_prompt_tokens(
        render_prompt(program, template_variables(program, value, pre_outputs=pre))
    )
