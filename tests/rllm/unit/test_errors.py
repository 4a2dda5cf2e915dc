import re
from pathlib import Path

import pytest

from keel.rllm.errors import (
    ERROR_CLASSES,
    EXIT_CODES,
    OutputSchemaError,
    ParseError,
    RllmError,
    RllmErrorPayload,
    error_from_payload,
    redact_secrets,
)

DOC = Path(__file__).parents[3] / "docs" / "rllm-errors.md"


def test_ten_classes_with_distinct_codes_and_exit_codes():
    assert len(ERROR_CLASSES) == 10
    assert set(EXIT_CODES) == set(ERROR_CLASSES)
    codes = list(EXIT_CODES.values())
    assert len(set(codes)) == len(codes)
    # 0 is success, 1 an unexpected crash, 2 a CLI usage error; shells reserve 126 and up.
    assert all(10 <= c < 126 for c in codes)
    error_codes = [c.error_code for c in ERROR_CLASSES]
    assert len(set(error_codes)) == len(error_codes)
    assert all(re.fullmatch(r"RLLM_[A-Z_]+", c) for c in error_codes)
    assert all(issubclass(c, RllmError) for c in ERROR_CLASSES)


def test_payload_has_the_eight_fields():
    err = OutputSchemaError(
        "bad",
        details={"issues": [{"path": "$.a", "message": "required property is missing"}]},
        expected_schema={"type": "object"},
        received_payload="{}",
    )
    p = err.to_payload()
    assert list(p.model_dump()) == [
        "error_code",
        "error_type",
        "message",
        "details",
        "expected_schema",
        "received_payload",
        "recovery_hint",
        "doc_ref",
    ]
    assert p.error_type == "OutputSchemaError"
    assert p.error_code == "RLLM_OUTPUT_SCHEMA_MISMATCH"
    assert p.recovery_hint == OutputSchemaError.default_hint
    assert p.doc_ref == "docs/rllm-errors.md#outputschemaerror"
    assert str(err) == "bad"


def test_payload_round_trip_rebuilds_the_class():
    err = ParseError("x.rllm:3:1: nope", details={"line": 3}, recovery_hint="fix line 3")
    back = error_from_payload(err.to_payload().model_dump(mode="json"))
    assert type(back) is ParseError
    assert back.to_payload() == err.to_payload()
    with pytest.raises(ValueError, match=r"unknown \.rllm error code"):
        error_from_payload(
            RllmErrorPayload(
                error_code="NOPE", error_type="X", message="m", recovery_hint="h", doc_ref="d"
            )
        )


def test_every_class_is_documented_under_its_anchor():
    doc = DOC.read_text()
    headings = {
        h.strip().lower().replace(" ", "-") for h in re.findall(r"^## (.+)$", doc, flags=re.M)
    }
    for cls in ERROR_CLASSES:
        assert cls.doc_ref().split("#")[1] in headings, cls.__name__
        assert cls.error_code in doc, cls.__name__
        assert f"| {cls.exit_code} |" in doc or f"exit code {cls.exit_code}" in doc, cls.__name__


def test_redact_secrets_hides_secret_looking_keys_only():
    value = {
        "api_key": "sk-1",
        "nested": [{"auth_token": "t", "Authorization": "Bearer x"}],
        "max_tokens": 10,
        "tokens": 3,
        "client_secret": "s",
    }
    assert redact_secrets(value) == {
        "api_key": "***",
        "nested": [{"auth_token": "***", "Authorization": "***"}],
        "max_tokens": 10,
        "tokens": 3,
        "client_secret": "***",
    }
