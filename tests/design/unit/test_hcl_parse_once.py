"""tests/support/hcl.py: ``parse_once`` gives each call the document python-hcl2 gives,
a copy of its own, parses a text once, and puts ``hcl2.loads`` back when it ends."""

from __future__ import annotations

import hcl2
import pytest
from lark.exceptions import LarkError

from tests.support.hcl import parse_once

TEXT = 'resource "aws_s3_bucket" "raw" {\n  bucket = "raw-data"\n}\n'


def test_the_same_document_each_call_a_copy_of_its_own() -> None:
    real = hcl2.loads
    expected = real(TEXT)
    with parse_once():
        assert hcl2.loads is not real
        first = hcl2.loads(TEXT)
        assert first == expected
        first["resource"].clear()  # a reader that changes what it was given
        assert hcl2.loads(TEXT) == expected
        assert hcl2.loads(TEXT, with_meta=True) == real(TEXT, with_meta=True)
    assert hcl2.loads is real


def test_a_text_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = hcl2.loads

    def counting(text: str, with_meta: bool = False) -> dict[str, object]:
        calls.append(text)
        doc: dict[str, object] = real(text, with_meta=with_meta)
        return doc

    monkeypatch.setattr(hcl2, "loads", counting)
    with parse_once():
        for _ in range(3):
            hcl2.loads(TEXT)
    assert calls == [TEXT]


def test_a_text_that_does_not_parse_raises_each_time() -> None:
    with parse_once():
        for _ in range(2):
            with pytest.raises(LarkError):
                hcl2.loads('resource "x" {')
    assert hcl2.loads("a = 1\n") == {"a": 1}
