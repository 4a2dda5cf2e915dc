"""The MRP job DSL, version 0.1: pydantic models and a line-tracking YAML parser.

A job file is one YAML mapping. :func:`parse_job` loads it with a ``SafeLoader`` subclass
that refuses duplicate and non-string keys and keeps dates as strings, records the line of
every key and list item, validates the data against :class:`JobSpec` (unknown fields are
refused everywhere), and reports each problem as a :class:`~keel.mrp.errors.DslIssue`
with its dotted path and line. ``docs/mrp-dsl.md`` is the reference.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from keel.ids import GATE_NAME_PATTERN
from keel.mrp.errors import DslError, DslIssue
from keel.yaml_limits import BoundedComposerMixin, YamlLimitError

DSL_VERSION = "0.1"
SUPPORTED_DSL_VERSIONS = frozenset({DSL_VERSION})

NAME_PATTERN = r"[a-z][a-z0-9_.-]{0,63}"
VERSION_PATTERN = r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?"
OPERATOR_REF_RE = re.compile(rf"^(?P<name>{NAME_PATTERN})@(?P<version>{VERSION_PATTERN})$")
JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
EGRESS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
GATE_NAME_RE = re.compile(GATE_NAME_PATTERN)
URI_RE = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>.+)$")

# A YAML alias can make a small file expand into a huge tree ("billion laughs"), and deep
# nesting would exhaust PyYAML's recursive composer. The compiler walks every node once per
# path, so the loader refuses both while it composes, before anything walks the data.
MAX_YAML_NODES = 200_000
MAX_YAML_DEPTH = 64
MAX_JOB_BYTES = 16 * 1024 * 1024


#: Record formats an input can name (``inputs.format``); without one, a file is one item.
RecordFormat = Literal["jsonl", "csv", "parquet"]
#: What a malformed record does to its shard (``inputs.on_malformed``).
OnMalformed = Literal["fail", "skip"]
#: A Parquet column a job selects (``inputs.columns``): a top-level field's name.
ColumnName = Annotated[str, StringConstraints(min_length=1, max_length=1000)]
S3_URI_RE = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.*)$")

#: URI schemes a produce sink can be written to by the runtime (the artifact store's S3
#: client). Any other scheme is refused at compile (policy rule MRP-P016).
WRITABLE_SCHEMES = frozenset({"s3"})
S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SINK_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._=-]+$")


@dataclass(frozen=True)
class S3Location:
    """Where an ``s3://bucket/key`` sink writes: a bucket and a key prefix that every
    produced file's relative path is appended to (``prefix`` ends with ``/`` or is empty).
    ``file_name`` is what the producer names its data file (the URI's last segment, or
    ``output.<kind>`` for a prefix URI ending in ``/``)."""

    bucket: str
    prefix: str
    file_name: str | None

    def key_for(self, rel_path: str) -> str:
        """The object key of a produced file's relative path."""
        return self.prefix + rel_path

    def uri_for(self, rel_path: str) -> str:
        """``s3://bucket/<key>`` of a produced file."""
        return f"s3://{self.bucket}/{self.key_for(rel_path)}"


def parse_s3_destination(destination: str) -> S3Location:
    """Split an ``s3://bucket/path`` sink destination; :class:`ValueError` says what the
    runtime could not write (bad bucket name, empty or dot segments, odd characters)."""
    m = URI_RE.match(destination)
    if m is None or m.group("scheme") != "s3":
        raise ValueError(f"destination {destination!r} is not an s3:// URI")
    bucket, sep, key = m.group("rest").partition("/")
    if not S3_BUCKET_RE.match(bucket) or ".." in bucket:
        raise ValueError(
            f"destination {destination!r}: {bucket!r} is not a valid S3 bucket name "
            "(3-63 lowercase letters, digits, '.' and '-')"
        )
    if not sep or not key:
        raise ValueError(
            f"destination {destination!r} names no object or prefix inside the bucket "
            "(write s3://bucket/name.json or s3://bucket/prefix/)"
        )
    is_prefix = key.endswith("/")
    segments = key.rstrip("/").split("/") if key.rstrip("/") else []
    for seg in segments:
        if seg in ("", ".", "..") or not _SINK_SEGMENT_RE.match(seg):
            raise ValueError(
                f"destination {destination!r}: path segment {seg!r} cannot be written "
                "(segments are letters, digits, '.', '_', '=' and '-'; no empty, '.' or "
                "'..' segments)"
            )
    if len(key.encode("utf-8")) > 900:
        raise ValueError(f"destination {destination!r}: the key is longer than 900 bytes")
    if is_prefix:
        return S3Location(bucket=bucket, prefix=key, file_name=None)
    head, _, tail = key.rpartition("/")
    return S3Location(bucket=bucket, prefix=f"{head}/" if head else "", file_name=tail)


def destination_problem(destination: str) -> str | None:
    """Why the runtime cannot write ``destination`` (None: it can). Relative paths are
    checked by the DSL itself; URIs must be ``s3://`` and well formed."""
    m = URI_RE.match(destination)
    if m is None:
        return None
    scheme = m.group("scheme")
    if scheme not in WRITABLE_SCHEMES:
        return (
            f"destination {destination!r} uses scheme {scheme!r}, which this runtime cannot "
            "write (it writes relative paths under the run's output root and s3:// URIs)"
        )
    try:
        parse_s3_destination(destination)
    except ValueError as e:
        return str(e)
    return None


class SinkKind(StrEnum):
    """Formats a produce step can write."""

    JSON = "json"
    PARQUET = "parquet"


def split_ref(ref: str) -> tuple[str, str]:
    """Split ``name@version`` into its parts; :class:`ValueError` if it is not pinned."""
    m = OPERATOR_REF_RE.match(ref)
    if m is None:
        raise ValueError(
            f"operator {ref!r} must be pinned as name@version (for example sentiment@1.2.0)"
        )
    return m.group("name"), m.group("version")


def _check_ref(ref: str) -> str:
    split_ref(ref)
    return ref


def _check_finite(value: JsonValue) -> JsonValue:
    # NaN and infinities have no canonical JSON form, so no digest could name them.
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("NaN and infinite numbers are not allowed (no canonical JSON form)")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return value


def _check_relative_path(path: str, what: str) -> None:
    # Paths are resolved by activities under a root they choose; refusing absolute paths,
    # backslashes and ``..`` means a job can never name a file outside that root.
    if not path or path != path.strip():
        raise ValueError(f"{what} must be a non-empty path without surrounding spaces")
    if "\\" in path or "\x00" in path:
        raise ValueError(f"{what} {path!r} must use '/' separators")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise ValueError(f"{what} {path!r} must be relative to the job's root")
    if ".." in pure.parts:
        raise ValueError(f"{what} {path!r} must not contain '..'")
    if str(pure) != path:
        # PurePosixPath drops "./", "//" and a trailing "/"; insisting on that form keeps
        # one spelling per path, so patterns and resolved paths compare as text.
        raise ValueError(f"{what} {path!r} must be written as {str(pure)!r}")


def _check_pattern(pattern: str) -> str:
    if "://" in pattern:
        m = S3_URI_RE.match(pattern)
        if m is None:
            raise ValueError(
                f"input {pattern!r}: the only URIs an input may name are s3://bucket/prefix "
                "(bucket: 3-63 lowercase letters, digits, '.' or '-')"
            )
        key = m.group("key")
        if key:
            # One spelling per key, as for relative paths; a trailing '/' means "every
            # object under this prefix".
            _check_relative_path(key.removesuffix("/"), "input key")
        return pattern
    _check_relative_path(pattern, "input pattern")
    return pattern


def _check_destination(destination: str) -> str:
    if URI_RE.match(destination):
        return destination
    _check_relative_path(destination, "sink destination")
    return destination


def _check_egress(name: str) -> str:
    if not EGRESS_RE.match(name):
        raise ValueError(f"egress name {name!r} must match {EGRESS_RE.pattern}")
    return name


OperatorRefStr = Annotated[str, AfterValidator(_check_ref)]
FiniteJson = Annotated[JsonValue, AfterValidator(_check_finite)]
InputPattern = Annotated[str, AfterValidator(_check_pattern)]
EgressName = Annotated[str, AfterValidator(_check_egress)]


class _Spec(BaseModel):
    # Unknown fields are refused everywhere: a typo must never silently mean "default".
    model_config = ConfigDict(extra="forbid", frozen=True)


_RECORD_KEYS = ("format", "records_per_shard", "bytes_per_shard", "on_malformed", "columns")


class InputsSpec(_Spec):
    """Where the job's items come from and how they are cut into shards.

    Exactly one of ``items`` (inline JSON values) or ``files`` (relative paths or globs,
    or ``s3://bucket/prefix/`` URIs). Without ``format`` each matched file is one item and
    exactly one of ``shard_size`` (items per shard) or ``by: item`` applies. With
    ``format`` (``jsonl``, ``csv``, ``parquet``) each file's records are the items, cut
    into shards of ``records_per_shard`` records or about ``bytes_per_shard`` bytes (at
    record boundaries, never across files); ``on_malformed`` (``fail``, the default, or
    ``skip``) says what a record that cannot be read does to its shard. ``columns``
    (Parquet only) names the columns a record holds: a shard reads only those column
    chunks of its row groups, and a record is ``{column: value}`` of those columns.
    """

    items: list[FiniteJson] | None = None
    files: list[InputPattern] | None = None
    shard_size: int | None = Field(default=None, ge=1, le=1_000_000, strict=True)
    by: Literal["item"] | None = None
    format: RecordFormat | None = None
    records_per_shard: int | None = Field(default=None, ge=1, le=10_000_000, strict=True)
    bytes_per_shard: int | None = Field(default=None, ge=1, le=1 << 40, strict=True)
    on_malformed: OnMalformed | None = None
    columns: list[ColumnName] | None = Field(default=None, min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _one_source_one_mode(self) -> InputsSpec:
        if (self.items is None) == (self.files is None):
            raise ValueError("give exactly one of 'items' or 'files'")
        if self.format is not None:
            if self.files is None:
                raise ValueError("'format' reads records from 'files', not from 'items'")
            if self.shard_size is not None or self.by is not None:
                raise ValueError(
                    "with 'format', cut shards by 'records_per_shard' or 'bytes_per_shard', "
                    "not 'shard_size' or 'by'"
                )
            if (self.records_per_shard is None) == (self.bytes_per_shard is None):
                raise ValueError("give exactly one of 'records_per_shard' or 'bytes_per_shard'")
            if self.columns is not None and self.format != "parquet":
                raise ValueError("'columns' selects Parquet columns: it needs 'format: parquet'")
            if self.columns is not None and len(set(self.columns)) != len(self.columns):
                raise ValueError("'columns' names a column twice")
        else:
            extra = [
                k
                for k in ("records_per_shard", "bytes_per_shard", "on_malformed", "columns")
                if getattr(self, k) is not None
            ]
            if extra:
                raise ValueError(f"'{extra[0]}' needs 'format' (jsonl, csv or parquet)")
            if (self.shard_size is None) == (self.by is None):
                raise ValueError("give exactly one of 'shard_size' or 'by: item'")
        if self.items is not None and not self.items:
            raise ValueError("'items' must not be empty")
        if self.files is not None and not self.files:
            raise ValueError("'files' must not be empty")
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_record_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A job without ``format`` serialises as before these keys existed, so its job
        # digest (and so its IR and manifest digests) does not change.
        data = handler(self)
        if isinstance(data, dict):
            for key in _RECORD_KEYS:
                if data.get(key) is None:
                    data.pop(key, None)
        return data

    @property
    def items_per_shard(self) -> int:
        """How many items (files, without ``format``) go in each shard (the last may hold
        fewer). A record-sharded input has at least one shard per file: 1."""
        if self.format is not None:
            return 1
        return 1 if self.by == "item" else int(self.shard_size or 1)

    @property
    def malformed_policy(self) -> OnMalformed:
        """``on_malformed``, ``fail`` when not given."""
        return self.on_malformed or "fail"


class OperatorCall(_Spec):
    """A pinned operator and the parameters it is called with."""

    operator: OperatorRefStr
    params: dict[str, FiniteJson] = Field(default_factory=dict)


class MapSpec(OperatorCall):
    """The map step: ``operator`` runs once per shard.

    ``min_success_ratio`` (as Flyte map tasks have it): the share of shards that must
    succeed for the job to go on. Absent means 1 (today's behaviour: one shard that fails
    for good fails the job). Below 1, shards that fail for good are recorded with their
    error, the other shards still run, and when at least that share succeeded the reduce
    runs over the shards that did, in shard order; otherwise the job fails as before.
    """

    min_success_ratio: Decimal | None = Field(default=None, gt=0, le=1)

    @model_serializer(mode="wrap")
    def _omit_default_ratio(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Absent and 1 both mean "every shard": the canonical form omits the key, so the
        # digests of jobs written before the key existed stay what they were.
        data = handler(self)
        if isinstance(data, dict) and (
            self.min_success_ratio is None or self.min_success_ratio == 1
        ):
            data.pop("min_success_ratio", None)
        return data

    @property
    def success_ratio(self) -> Decimal | None:
        """The ratio when below 1 (failed shards are tolerated), else None."""
        r = self.min_success_ratio
        return r if r is not None and r < 1 else None


class ReduceSpec(OperatorCall):
    """The reduce step: ``operator`` runs once over all shard outputs in shard order."""


class SinkSpec(_Spec):
    """Where the produce step writes: a format and a destination.

    ``destination`` is a relative path under the run's output root, or a URI
    (``s3://bucket/prefix``) that policy must allow explicitly.
    """

    kind: SinkKind
    destination: Annotated[str, AfterValidator(_check_destination)]


class ProduceSpec(OperatorCall):
    """The produce step: the only step that may write outside the artifact store."""

    sink: SinkSpec


class EvaluatorSpec(OperatorCall):
    """Optional evaluation of the reduced output; produce runs only if score >= min_score."""

    min_score: Decimal = Field(ge=0, le=1)


class ApprovalSpec(_Spec):
    """Optional human gate before produce (an ``ApprovalGate`` child workflow)."""

    gate: str
    approvers: list[str] = Field(default_factory=list)
    expires_in_s: float = Field(default=24 * 3600, gt=0, le=365 * 24 * 3600)

    @field_validator("gate")
    @classmethod
    def _gate_name(cls, v: str) -> str:
        if not GATE_NAME_RE.match(v):
            raise ValueError(f"gate name {v!r} must match {GATE_NAME_RE.pattern}")
        return v

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, v: list[str]) -> list[str]:
        if any(not a.strip() for a in v):
            raise ValueError("approvers must be non-empty names")
        # Order carries no meaning, so the canonical form is sorted and unique.
        return sorted(set(v))


class PolicySpec(_Spec):
    """What the job asks for. Admission checks each value against the service's caps."""

    max_workers: int = Field(default=4, ge=1, le=1_000_000, strict=True)
    shard_timeout_s: float = Field(default=300, gt=0, le=7 * 24 * 3600)
    # What one shard's operator may allocate in its host process (a soft RLIMIT_DATA over
    # the host's size before the call: activities/mrp/host.py); past it the shard fails.
    shard_memory_mb: int = Field(default=1024, ge=16, le=16 * 1024 * 1024, strict=True)
    max_shard_retries: int = Field(default=3, ge=0, le=1000, strict=True)
    budget_usd: Decimal | None = Field(default=None, ge=0)
    budget_units: Decimal | None = Field(default=None, ge=0)
    egress: list[EgressName] = Field(default_factory=list)
    allowed_operators: list[OperatorRefStr] | None = None
    allowed_sinks: list[SinkKind] | None = None

    @field_validator("egress")
    @classmethod
    def _sorted_egress(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    @field_validator("allowed_operators")
    @classmethod
    def _sorted_operators(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else sorted(set(v))

    @field_validator("allowed_sinks")
    @classmethod
    def _sorted_sinks(cls, v: list[SinkKind] | None) -> list[SinkKind] | None:
        return None if v is None else sorted(set(v))

    @model_validator(mode="after")
    def _has_budget(self) -> PolicySpec:
        # Every job carries a quota: a job without one could never be killed for spending.
        if self.budget_usd is None and self.budget_units is None:
            raise ValueError("give 'budget_usd' or 'budget_units' (or both)")
        return self


class JobSpec(_Spec):
    """A whole MRP job file (DSL v0.1)."""

    dsl_version: str
    job_id: str
    description: str = Field(default="", max_length=4000)
    inputs: InputsSpec
    map: MapSpec
    reduce: ReduceSpec
    produce: ProduceSpec
    policy: PolicySpec
    evaluator: EvaluatorSpec | None = None
    approval: ApprovalSpec | None = None

    @field_validator("dsl_version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if isinstance(v, int | float):
            # YAML reads 0.1 as a float, and 0.10 would read the same: versions are text.
            raise ValueError(f'dsl_version must be a quoted string, e.g. dsl_version: "{v}"')
        if v not in SUPPORTED_DSL_VERSIONS:
            raise ValueError(
                f"unsupported dsl_version {v!r}; supported: {sorted(SUPPORTED_DSL_VERSIONS)}"
            )
        return v

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str) -> str:
        if not JOB_ID_RE.match(v):
            raise ValueError(
                f"job_id {v!r} must be lowercase letters, digits, '.', '_' or '-' "
                "(at most 128, starting with a letter or digit)"
            )
        return v

    def operator_refs(self) -> dict[str, str]:
        """``role -> name@version`` for every operator the job uses, roles sorted."""
        refs = {
            "map": self.map.operator,
            "reduce": self.reduce.operator,
            "produce": self.produce.operator,
        }
        if self.evaluator is not None:
            refs["evaluate"] = self.evaluator.operator
        return dict(sorted(refs.items()))


# ---------------------------------------------------------------------------------------
# YAML with line numbers


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictKeys:
    """Refuses duplicate and non-string mapping keys (mixed in before a constructor)."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                    raise _YamlIssue(line, "mapping keys must be strings")
                key = key_node.value
                if key in seen:
                    raise _YamlIssue(line, f"duplicate key {key!r} (first on line {seen[key]})")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]


class _PyLineLoader(_StrictKeys, BoundedComposerMixin, yaml.SafeLoader):
    """SafeLoader that refuses duplicate and non-string keys and keeps dates as text.

    Duplicate keys are silently "last one wins" in PyYAML; in a job file that hides a
    mistake, so they are errors. Dates would load as ``datetime.date`` objects, which have
    no JSON form: they stay strings. Nesting and alias-expanded size are bounded.
    """

    max_depth = MAX_YAML_DEPTH
    max_nodes = MAX_YAML_NODES


_PyLineLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_LineLoader: type[Any] = _PyLineLoader
if yaml.__with_libyaml__:
    from yaml._yaml import CParser
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    class _CLineLoader(_StrictKeys, BoundedComposerMixin, Composer, SafeConstructor, Resolver, CParser):  # type: ignore[misc]  # fmt: skip
        """:class:`_PyLineLoader` reading with libyaml: its scanner and parser in C, the
        composer (with the limits, which count as the nodes are made), the constructor and
        the resolver PyYAML's own, so the data, the lines and the limits are the same. A
        job of 100,000 inline items loaded in 0.60 s against 2.88 s (bench/mrp_scale.py's
        job, measured here); PyYAML's C loader composes in C, past the limits."""

        max_depth = MAX_YAML_DEPTH
        max_nodes = MAX_YAML_NODES

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._reset_limits()

    _CLineLoader.yaml_implicit_resolvers = _PyLineLoader.yaml_implicit_resolvers
    _LineLoader = _CLineLoader


class _YamlIssue(Exception):
    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(message)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _record_lines(root: Node, lines: dict[str, int]) -> None:
    """Record the 1-based line of every mapping key and list item, by dotted path."""
    visited = 0
    stack: list[tuple[Node, str, int]] = [(root, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise _YamlIssue(1, f"document too large (more than {MAX_YAML_NODES} nodes)")
        if depth > MAX_YAML_DEPTH:
            raise _YamlIssue(
                node.start_mark.line + 1, f"nesting deeper than {MAX_YAML_DEPTH} levels"
            )
        if isinstance(node, MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    continue
                child = _join(path, key_node.value)
                lines.setdefault(child, key_node.start_mark.line + 1)
                stack.append((value_node, child, depth + 1))
        elif isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                child = _join(path, i)
                lines.setdefault(child, item.start_mark.line + 1)
                stack.append((item, child, depth + 1))


def load_yaml_with_lines(text: str, source: str = "") -> tuple[Any, dict[str, int]]:
    """Load one YAML document; return the data and ``{dotted path: line}``.

    Raises :class:`DslError` for syntax errors, several documents, duplicate or
    non-string keys and oversized documents, each with the line where it happened.
    """
    if len(text.encode("utf-8", errors="replace")) > MAX_JOB_BYTES:
        raise DslError(
            [DslIssue(path="", line=None, message="job file larger than 16 MiB")], source
        )
    if _LineLoader is not _PyLineLoader:
        try:
            return _load_with_lines(_LineLoader, text, source)
        except DslError as e:
            if not isinstance(e.__context__, yaml.YAMLError) or isinstance(
                e.__context__, YamlLimitError
            ):
                raise
            # libyaml's syntax errors say less than PyYAML's ("found character that cannot
            # start any token", not which): the pure-Python loader reads a document libyaml
            # refused again, and reports it (or loads it: what loaded before still does).
    return _load_with_lines(_PyLineLoader, text, source)


def _load_with_lines(loader_class: type[Any], text: str, source: str) -> tuple[Any, dict[str, int]]:
    lines: dict[str, int] = {"": 1}
    loader: Any = None
    try:
        # The reader refuses unprintable characters already here, so this is inside try.
        loader = loader_class(text)
        node = loader.get_single_node()
        if node is None:
            raise DslError([DslIssue(path="", line=1, message="job file is empty")], source)
        _record_lines(node, lines)
        data = loader.construct_document(node)
    except _YamlIssue as e:
        raise DslError([DslIssue(path="", line=e.line, message=e.message)], source) from None
    except YamlLimitError as e:
        message = f"document exceeds a limit: {e.message}"
        raise DslError([DslIssue(path="", line=e.line + 1, message=message)], source) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        message = " ".join(p for p in (e.context, e.problem) if p) or "invalid YAML"
        raise DslError([DslIssue(path="", line=line, message=message)], source) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise DslError([DslIssue(path="", line=line, message=str(e))], source) from None
    except yaml.YAMLError as e:
        raise DslError([DslIssue(path="", line=None, message=str(e))], source) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines


# ---------------------------------------------------------------------------------------
# Pydantic errors -> DSL issues


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    """The model class inside ``X``, ``X | None``, ``list[X]`` or ``Annotated[X, ...]``."""
    stack = [annotation]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
        origin = get_origin(a)
        if origin in (Union, types.UnionType, list, Annotated):
            stack.extend(get_args(a)[:1] if origin is Annotated else get_args(a))
    return None


def _model_at(parts: list[str | int]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = JobSpec
    for part in parts:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _unwrap_model(info.annotation)
    return model


def _child(container: Any, part: str | int) -> tuple[bool, Any]:
    if isinstance(container, dict) and part in container:
        return True, container[part]
    if isinstance(container, list) and isinstance(part, int) and 0 <= part < len(container):
        return True, container[part]
    return False, None


def _data_path(data: Any, loc: tuple[str | int, ...]) -> list[str | int]:
    """Keep the parts of a pydantic ``loc`` that name real keys or indexes in ``data``.

    Pydantic puts type tags in a ``loc`` for unions and JSON values (``'dict'``,
    ``'list[...]'``); those are not in the document and would make a confusing path. The
    last part stays even when absent: it names a missing field.
    """
    kept: list[str | int] = []
    current = data
    for i, part in enumerate(loc):
        found, child = _child(current, part)
        if found:
            kept.append(part)
            current = child
        elif i == len(loc) - 1 and isinstance(part, str) and "[" not in part:
            kept.append(part)
            current = None
        else:
            current = None
    return kept


def path_of(parts: list[str | int]) -> str:
    """``['inputs', 'items', 3, 'text']`` -> ``'inputs.items[3].text'``."""
    path = ""
    for part in parts:
        path = _join(path, part)
    return path


def line_of(parts: list[str | int], lines: dict[str, int]) -> int | None:
    """The line of the longest prefix of ``parts`` that the document has."""
    for n in range(len(parts), -1, -1):
        line = lines.get(path_of(parts[:n]))
        if line is not None:
            return line
    return None


def _message(err: Any, parts: list[str | int]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(parts[-1]) if parts else ""
        model = _model_at(parts[:-1])
        hint = ""
        if model is not None:
            close = difflib.get_close_matches(key, list(model.model_fields), n=1)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        return f"unknown field {key!r}{hint}"
    if kind == "missing":
        return "required field is missing"
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def issues_from_validation(
    error: ValidationError, data: Any, lines: dict[str, int]
) -> list[DslIssue]:
    """Turn pydantic errors into :class:`DslIssue` objects with paths and lines."""
    issues: list[DslIssue] = []
    for err in error.errors():
        parts = _data_path(data, tuple(err["loc"]))
        issues.append(
            DslIssue(path=path_of(parts), line=line_of(parts, lines), message=_message(err, parts))
        )
    # Report in document order, so the first issue is the first thing to fix.
    issues.sort(key=lambda i: (i.line if i.line is not None else 0, i.path))
    return issues


@dataclass(frozen=True)
class ParsedJob:
    """A validated job and the line of each key path in its file."""

    spec: JobSpec
    lines: dict[str, int] = field(default_factory=dict)
    source: str = ""

    def line(self, path: str) -> int | None:
        """Line of ``path`` or of its nearest enclosing key that the file has."""
        return nearest_line(self.lines, path)


def nearest_line(lines: Mapping[str, int], path: str) -> int | None:
    """Line of dotted ``path`` in ``lines``, else of its nearest enclosing path."""
    while True:
        if path in lines:
            return lines[path]
        if not path:
            return None
        cut = max(path.rfind("."), path.rfind("["))
        path = path[: max(cut, 0)]


def parse_job(text: str, source: str = "") -> ParsedJob:
    """Parse and validate a job file; :class:`DslError` lists every problem with its line."""
    data, lines = load_yaml_with_lines(text, source)
    if not isinstance(data, dict):
        raise DslError(
            [DslIssue(path="", line=1, message="a job file must be a YAML mapping")], source
        )
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        raise DslError(issues_from_validation(e, data, lines), source) from None
    return ParsedJob(spec=spec, lines=lines, source=source)
