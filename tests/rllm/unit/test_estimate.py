import pytest

from keel.rllm.errors import ContextWindowExceededError
from keel.rllm.estimate import (
    MESSAGE_OVERHEAD_TOKENS,
    check_context_window,
    estimate_prompt_tokens,
    estimate_tokens,
)


def test_estimate_is_utf8_bytes_over_four_rounded_up():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    # Three bytes per CJK character: 0.75 tokens each, not the 0.25 of the character rule.
    assert estimate_tokens("汉字汉字") == 3
    assert estimate_prompt_tokens("abcd") == 1 + MESSAGE_OVERHEAD_TOKENS


def test_fits_returns_the_estimate():
    prompt = "x" * 400  # 100 tokens + overhead
    assert check_context_window(prompt, 100 + MESSAGE_OVERHEAD_TOKENS + 50, 50) == 108


def test_one_token_over_is_refused_with_numbers():
    prompt = "x" * 400
    with pytest.raises(ContextWindowExceededError) as info:
        check_context_window(prompt, 100 + MESSAGE_OVERHEAD_TOKENS + 49, 50)
    d = info.value.details
    assert d["estimated_prompt_tokens"] == 108
    assert d["max_tokens"] == 50
    assert d["max_context_window"] == 157
    assert d["needed_tokens"] == 158
    assert d["over_by_tokens"] == 1
    assert "158 in all" in info.value.message
    assert "about 4 characters" in info.value.recovery_hint
