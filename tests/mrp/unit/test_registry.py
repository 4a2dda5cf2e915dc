"""Operator specs and the pure registry: validation, lookup errors, allow-list pins."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from keel.digest import digest_bytes
from keel.mrp import AllowEntry, OperatorSpec, Registry, RegistryError
from tests.mrp.unit.mrp_jobs import load_registry

REGISTRY = load_registry()
DIGEST = digest_bytes(b"code")


def spec(**overrides: Any) -> OperatorSpec:
    data: dict[str, Any] = {
        "name": "echo",
        "version": "1.0.0",
        "kind": "map",
        "entrypoint": "ops.echo:run",
        "code_digest": DIGEST,
    }
    data.update(overrides)
    return OperatorSpec.model_validate(data)


def test_lookup_by_exact_ref():
    assert REGISTRY.get("judge@1.0.0").kind == "evaluate"
    assert REGISTRY.find("judge@9.9.9") is None


def test_unknown_version_lists_known_versions():
    with pytest.raises(
        RegistryError, match=r"registered versions of tokens-count: 0\.9\.0, 1\.0\.0"
    ):
        REGISTRY.get("tokens-count@2.0.0")
    with pytest.raises(RegistryError, match="no operator named 'nope'"):
        REGISTRY.get("nope@1.0.0")
    with pytest.raises(RegistryError, match="must be pinned"):
        REGISTRY.get("judge")


def test_allow_list_and_digest_pins():
    assert REGISTRY.allow_problem(REGISTRY.get("judge@1.0.0")) is None
    assert "not on the allow-list" in (
        REGISTRY.allow_problem(REGISTRY.get("tokens-count@0.9.0")) or ""
    )
    moved = REGISTRY.get("tokens-count@1.0.0").model_copy(update={"code_digest": DIGEST})
    assert "but the allow-list pins" in (REGISTRY.allow_problem(moved) or "")


def test_empty_allow_list_allows_nothing():
    registry = Registry(operators=[spec()])
    assert registry.allow_problem(spec()) is not None
    assert Registry.pinning_all([spec()]).allow_problem(spec()) is None


def test_registry_refuses_duplicates_and_conflicting_pins():
    with pytest.raises(ValidationError, match=r"registered twice: echo@1\.0\.0"):
        Registry(operators=[spec(), spec(description="again")])
    with pytest.raises(ValidationError, match="different digests"):
        Registry(
            allow=[
                AllowEntry(ref="echo@1.0.0", code_digest=DIGEST),
                AllowEntry(ref="echo@1.0.0", code_digest=digest_bytes(b"other")),
            ]
        )


def test_registry_digest_ignores_listing_order():
    a, b = spec(), spec(name="other")
    assert Registry.pinning_all([a, b]).digest() == Registry.pinning_all([b, a]).digest()


def test_allow_entry_parse():
    assert AllowEntry.parse("echo@1.0.0") == AllowEntry(ref="echo@1.0.0")
    assert AllowEntry.parse(f"echo@1.0.0#{DIGEST}").code_digest == DIGEST
    with pytest.raises(ValidationError):
        AllowEntry.parse("echo@1.0.0#sha256:abc")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"kind": "produce"}, "must list the sink kinds"),
        ({"sinks": ["json"]}, "only produce operators may write sinks"),
        (
            {"llm": {"calls_per_item": "1", "tokens_per_call": 10, "usd_per_1k_tokens": "1"}},
            "must list 'llm' in egress",
        ),
        ({"code_digest": "sha256:00"}, "code_digest must be 'blake3:'"),
        ({"signature": "abc"}, "128 lowercase hex"),
        ({"entrypoint": "ops/echo.py"}, "package.module:function"),
        ({"input_schema": {"type": "no-such-type"}}, "not a valid JSON Schema"),
        ({"version": "latest"}, "String should match pattern"),
        ({"image": "python:3.12"}, "Extra inputs are not permitted"),
        ({"cost_weight": "-1"}, "greater than or equal to 0"),
    ],
)
def test_operator_spec_validation(overrides: dict[str, Any], fragment: str):
    with pytest.raises(ValidationError, match=fragment):
        spec(**overrides)


def test_schema_check_is_remembered_for_valid_schemas_only():
    """A spec parsed again (the operator host parses the handle of every shard) does not
    walk its schemas against the metaschema again; an invalid schema is refused every
    time, with its message, in any key order."""
    from keel.mrp import registry

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    registry._check_schema_text.cache_clear()
    for _ in range(3):
        assert spec(input_schema=schema, output_schema=dict(reversed(schema.items())))
    info = registry._check_schema_text.cache_info()
    assert (info.misses, info.hits) == (1, 5)  # one schema (keys sorted), six checks
    bad = {"properties": {"n": {"type": "no-such-type"}}}
    for _ in range(2):
        with pytest.raises(ValidationError, match="not a valid JSON Schema: 'no-such-type'"):
            spec(input_schema=bad)
    assert registry._check_schema_text.cache_info().currsize == 1


def test_signature_covers_everything_but_itself():
    base = spec()
    signed = spec(signature="ab" * 64)
    assert base.spec_digest() == signed.spec_digest()
    assert signed.signing_message() == base.spec_digest().encode("ascii")
    assert spec(entrypoint="ops.echo:other").spec_digest() != base.spec_digest()
    assert spec(cost_weight="3").spec_digest() != base.spec_digest()


def test_schema_errors_name_the_place():
    op = REGISTRY.get("tokens-count@1.0.0")
    assert op.schema_errors("input", {"id": 1, "text": "hi"}) == []
    problems = op.schema_errors("input", {"id": "x"})
    assert [(p.path, p.message) for p in problems] == [
        ((), "'text' is a required property"),
        (("id",), "'x' is not of type 'integer'"),
    ]
    assert op.schema_errors("params", {"lowercase": True}) == []
    assert spec().schema_errors("params", {"anything": 1}) == []  # no schema: anything goes
