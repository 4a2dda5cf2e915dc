"""The operator registry, data side: ``operator.yaml`` models and a pure lookup table.

An operator is a pinned, versioned piece of code (a map agent, a reducer, a producer or an
evaluator). Its ``operator.yaml`` is an :class:`OperatorSpec`. Loading those files, hashing
the code into ``code_digest`` and checking ``signature`` are I/O and belong to an activity;
that activity builds a :class:`Registry` from the specs it trusts plus the service's
allow-list, and everything here stays pure so the compiler and workflows can use it.

The signature, when present, is an ed25519 signature (hex) over
:meth:`OperatorSpec.signing_message`: the ASCII bytes of the spec digest, which covers the
code digest, entrypoint, schemas and cost, so none of them can be swapped under a valid
signature.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal, NamedTuple

import jsonschema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from keel.digest import checked_digest, digest_json
from keel.mrp.dsl import (
    NAME_PATTERN,
    VERSION_PATTERN,
    EgressName,
    OperatorRefStr,
    SinkKind,
    split_ref,
)
from keel.mrp.errors import RegistryError

ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_]\w*$")
SIGNATURE_RE = re.compile(r"^[0-9a-f]{128}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

# The JSON Schema dialect used for input, output and params schemas.
SchemaValidator = jsonschema.Draft202012Validator


def check_schema(schema: dict[str, Any]) -> None:
    """``SchemaValidator.check_schema``, remembered for schemas found valid.

    Checking a schema walks it against the draft's metaschema: a few ms for an operator's
    small schemas. A spec is validated wherever its handle arrives as JSON: the operator
    host parses the handle of every call, so once per shard, and on a warm 2,000-shard
    map that check was 58% of the hosts' time (bench/mrp_scale.py, docs/mrp-runtime.md). A schema
    is a JSON value, so its canonical text names it; only successes are kept (an invalid
    schema raises every time, with its message).
    """
    _check_schema_text(json.dumps(schema, sort_keys=True, separators=(",", ":")))


@functools.lru_cache(maxsize=256)
def _check_schema_text(text: str) -> None:
    SchemaValidator.check_schema(json.loads(text))


class SchemaProblem(NamedTuple):
    """One JSON Schema failure: where in the value (keys and indexes) and what."""

    path: tuple[str | int, ...]
    message: str


class OperatorKind(StrEnum):
    """The step an operator can fill."""

    MAP = "map"
    REDUCE = "reduce"
    PRODUCE = "produce"
    EVALUATE = "evaluate"


class LlmEstimate(BaseModel):
    """What an LLM-calling operator expects to spend, for the compile-time estimate.

    An *item* is an input item for a map operator, a shard output for a reducer, and the
    one reduced output for an evaluator or producer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    calls_per_item: Decimal = Field(ge=0)
    tokens_per_call: int = Field(ge=0, strict=True)
    usd_per_1k_tokens: Decimal = Field(ge=0)


#: Validators of the schemas in use, by the schema dict's identity (with the dict itself,
#: so an id is never taken for another dict's): building one is most of checking a small
#: value (its registry and resolver), and a map shard checks every item and its output.
_validators: dict[int, tuple[dict[str, Any], tuple[Any, Any]]] = {}
_VALIDATORS_KEPT = 256


#: The keywords of schemas that ``jsonschema_rs`` may pass on its own: on these the two
#: libraries agree (types, bounds, lengths, required, enum, combinators). A schema with
#: any other keyword (``pattern``: Python's and Rust's regexes differ at the edges,
#: ``format``, ``$ref``, ...) is checked by ``jsonschema`` alone.
_FAST_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "items", "additionalProperties", "anyOf",
        "oneOf", "allOf", "not", "enum", "const", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minLength",
        "maxLength", "minProperties", "maxProperties", "uniqueItems", "prefixItems",
        "title", "description", "default", "examples", "$comment",
    }
)  # fmt: skip


def _fast_keywords_only(node: Any) -> bool:
    """Whether every subschema of ``node`` uses :data:`_FAST_KEYWORDS` only."""
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict):
        return False
    for key, value in node.items():
        if key not in _FAST_KEYWORDS:
            return False
        if key == "properties":
            subschemas = list(value.values()) if isinstance(value, dict) else [None]
        elif key in {"items", "additionalProperties", "not"}:
            subschemas = [value]
        elif key in {"anyOf", "oneOf", "allOf", "prefixItems"}:
            subschemas = list(value) if isinstance(value, list) else [None]
        else:
            continue
        if not all(map(_fast_keywords_only, subschemas)):
            return False
    return True


def _fast_validator(schema: dict[str, Any]) -> Any:
    """A ``jsonschema_rs`` validator of ``schema`` when its keywords allow one (about 40
    times faster on a valid value: a map shard checks every item and its output), else
    ``None``."""
    if not _fast_keywords_only(schema):
        return None
    try:
        import jsonschema_rs

        return jsonschema_rs.validator_for(schema)
    except Exception:  # not installed, or a schema it does not take: jsonschema alone
        return None


def _validator(schema: dict[str, Any]) -> tuple[Any, Any]:
    """A ``SchemaValidator`` of ``schema`` and its fast validator (or ``None``), made once
    while the dict lives here."""
    kept = _validators.get(id(schema))
    if kept is not None and kept[0] is schema:
        return kept[1]
    validators = (SchemaValidator(schema), _fast_validator(schema))
    if len(_validators) >= _VALIDATORS_KEPT:
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):  # another thread's
            _validators.pop(next(iter(_validators)))
    _validators[id(schema)] = (schema, validators)
    return validators


class OperatorSpec(BaseModel):
    """One ``operator.yaml``: identity, contract, cost and provenance of an operator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=rf"^{NAME_PATTERN}$")
    version: str = Field(pattern=rf"^{VERSION_PATTERN}$")
    kind: OperatorKind
    entrypoint: str = Field(description="module.path:callable inside the operator's code.")
    description: str = Field(default="", max_length=4000)
    input_schema: dict[str, JsonValue] = Field(
        default_factory=dict, description="JSON Schema of one input item; {} accepts any."
    )
    output_schema: dict[str, JsonValue] = Field(default_factory=dict)
    params_schema: dict[str, JsonValue] | None = Field(
        default=None, description="JSON Schema of the job's params; None accepts any."
    )
    cost_weight: Decimal = Field(
        default=Decimal(1), ge=0, description="Cost units per invocation (per shard for map)."
    )
    llm: LlmEstimate | None = None
    egress: list[EgressName] = Field(
        default_factory=list, description="Network classes the operator needs, e.g. ['llm']."
    )
    sinks: list[SinkKind] = Field(
        default_factory=list, description="Formats a produce operator can write."
    )
    env: list[str] = Field(
        default_factory=list,
        description="Environment variables the operator's process gets (names; values from "
        "the worker's environment). It gets no other variable.",
    )
    batch: Literal["arrow"] | None = Field(
        default=None,
        description="A map operator that takes a Parquet shard whole: 'arrow' (its class "
        "implements map_arrow, given one Arrow table of the shard's records); None: records "
        "one by one (map) for every input.",
    )
    code_digest: str = Field(description="blake3:<hex> of the operator's code tree.")
    signature: str | None = Field(default=None, description="ed25519 signature, hex.")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"env name {name!r} must match {ENV_NAME_RE.pattern}")
        return sorted(set(v))

    @model_serializer(mode="wrap")
    def _omit_empty_env(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Specs without env dump (and so digest and verify) as they did before the field.
        data = handler(self)
        if isinstance(data, dict) and not self.env:
            data.pop("env", None)
        if isinstance(data, dict) and self.batch is None:
            data.pop("batch", None)  # likewise for specs without batch
        return data

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if not ENTRYPOINT_RE.match(v):
            raise ValueError(f"entrypoint {v!r} must look like 'package.module:function'")
        return v

    @field_validator("code_digest")
    @classmethod
    def _code_digest(cls, v: str) -> str:
        return checked_digest(v, "code_digest")

    @field_validator("signature")
    @classmethod
    def _signature(cls, v: str | None) -> str | None:
        if v is not None and not SIGNATURE_RE.match(v):
            raise ValueError("signature must be 128 lowercase hex digits (ed25519)")
        return v

    @field_validator("input_schema", "output_schema", "params_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                check_schema(v)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a valid JSON Schema: {e.message}") from None
        return v

    @field_validator("egress", "sinks")
    @classmethod
    def _sorted(cls, v: list[Any]) -> list[Any]:
        return sorted(set(v))

    @model_validator(mode="after")
    def _consistent(self) -> OperatorSpec:
        if self.kind is OperatorKind.PRODUCE and not self.sinks:
            raise ValueError("a produce operator must list the sink kinds it writes")
        if self.kind is not OperatorKind.PRODUCE and self.sinks:
            raise ValueError("only produce operators may write sinks")
        if self.batch is not None and self.kind is not OperatorKind.MAP:
            raise ValueError("only map operators take a shard as a batch (batch: arrow)")
        if self.llm is not None and "llm" not in self.egress:
            # An LLM estimate without LLM egress would let the operator's real network use
            # escape the egress rule; declare both or neither.
            raise ValueError("an operator with an llm estimate must list 'llm' in egress")
        return self

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    def spec_digest(self) -> str:
        """Digest of everything in the spec except the signature."""
        return digest_json(self.model_dump(mode="json", exclude={"signature"}))

    def signing_message(self) -> bytes:
        """The bytes an operator signature covers."""
        return self.spec_digest().encode("ascii")

    def schema_errors(
        self, which: Literal["input", "output", "params"], value: Any, limit: int = 5
    ) -> list[SchemaProblem]:
        """Problems of ``value`` against one of this operator's schemas (empty: valid).

        At most ``limit`` problems, in path order, each with the path inside ``value``.
        """
        schema = {
            "input": self.input_schema,
            "output": self.output_schema,
            "params": self.params_schema,
        }[which]
        if not schema:
            return []
        slow, fast = _validator(schema)
        if fast is not None:
            # A value the fast validator passes has no problems; one it fails (or cannot
            # read) is checked by jsonschema, whose problems are the ones reported.
            with contextlib.suppress(Exception):
                if fast.is_valid(value):
                    return []
        errors = sorted(slow.iter_errors(value), key=lambda e: [str(p) for p in e.path])
        return [SchemaProblem(tuple(e.absolute_path), e.message) for e in errors[:limit]]


class AllowEntry(BaseModel):
    """One allow-list entry: an exact ``name@version``, optionally pinned to a code digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: OperatorRefStr
    code_digest: str | None = None

    @field_validator("code_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return None if v is None else checked_digest(v, "code_digest")

    @classmethod
    def parse(cls, text: str) -> AllowEntry:
        """``name@version`` or ``name@version#blake3:<hex>``."""
        ref, _, digest = text.partition("#")
        return cls(ref=ref, code_digest=digest or None)


class Registry(BaseModel):
    """The operators the compiler may resolve, and the allow-list admission checks.

    An operator must be both registered and allow-listed to be used; an allow-list entry
    with a ``code_digest`` also pins the code. An empty allow-list allows nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    operators: list[OperatorSpec] = Field(default_factory=list)
    allow: list[AllowEntry] = Field(default_factory=list)

    _by_ref: dict[str, OperatorSpec] = PrivateAttr(default_factory=dict)
    _allow_by_ref: dict[str, AllowEntry] = PrivateAttr(default_factory=dict)

    @field_validator("operators")
    @classmethod
    def _unique_operators(cls, v: list[OperatorSpec]) -> list[OperatorSpec]:
        refs = [s.ref for s in v]
        dupes = sorted({r for r in refs if refs.count(r) > 1})
        if dupes:
            raise ValueError(f"operators registered twice: {', '.join(dupes)}")
        # Canonical order, so two registries with the same content have the same digest.
        return sorted(v, key=lambda s: s.ref)

    @field_validator("allow")
    @classmethod
    def _unique_allow(cls, v: list[AllowEntry]) -> list[AllowEntry]:
        unique = sorted(set(v), key=lambda e: (e.ref, e.code_digest or ""))
        refs = [e.ref for e in unique]
        dupes = sorted({r for r in refs if refs.count(r) > 1})
        if dupes:
            raise ValueError(f"allow-list pins different digests for: {', '.join(dupes)}")
        return unique

    def model_post_init(self, context: Any, /) -> None:
        self._by_ref = {s.ref: s for s in self.operators}
        self._allow_by_ref = {e.ref: e for e in self.allow}

    @classmethod
    def pinning_all(cls, operators: list[OperatorSpec]) -> Registry:
        """A registry that allow-lists every given operator, pinned to its code digest."""
        return cls(
            operators=operators,
            allow=[AllowEntry(ref=s.ref, code_digest=s.code_digest) for s in operators],
        )

    def find(self, ref: str) -> OperatorSpec | None:
        """The spec registered as ``ref``, or None."""
        return self._by_ref.get(ref)

    def get(self, ref: str) -> OperatorSpec:
        """The spec registered as ``ref``; :class:`RegistryError` says what is known instead."""
        try:
            name, _version = split_ref(ref)
        except ValueError as e:
            raise RegistryError(str(e)) from None
        spec = self._by_ref.get(ref)
        if spec is not None:
            return spec
        versions = sorted(s.version for s in self.operators if s.name == name)
        if versions:
            raise RegistryError(
                f"operator {ref} is not registered; registered versions of {name}: "
                + ", ".join(versions)
            )
        raise RegistryError(f"operator {ref} is not registered (no operator named {name!r})")

    def allow_problem(self, spec: OperatorSpec) -> str | None:
        """Why ``spec`` is not allow-listed, or None when it is."""
        entry = self._allow_by_ref.get(spec.ref)
        if entry is None:
            return f"operator {spec.ref} is not on the allow-list"
        if entry.code_digest is not None and entry.code_digest != spec.code_digest:
            return (
                f"operator {spec.ref} has code digest {spec.code_digest}, "
                f"but the allow-list pins {entry.code_digest}"
            )
        return None

    def digest(self) -> str:
        """Digest of the registry's content (operators and allow-list)."""
        return digest_json(self)
