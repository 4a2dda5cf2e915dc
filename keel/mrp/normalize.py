"""Determinism: canonical inputs and shards, seed derivation, and the numeric policy.

Everything here is a pure function of its arguments, so the compiler, the workflow and a
replay compute the same shards, seeds and sums on any machine:

- **Inputs.** Inline items keep their order (a list is content). Files are sorted by path
  and de-duplicated, because glob expansion order depends on the filesystem.
- **Shards.** Consecutive runs of ``items_per_shard`` items, numbered from 0. A shard's
  input digest is BLAKE3 over its canonical JSON.
- **Seeds.** The job seed is BLAKE3 (derive-key mode) over ``(dsl_version, job_id,
  inputs_digest, operator versions)``; each shard's seed is derived from the job seed and
  the shard's input digest, each phase's from the job seed and the phase name.
- **Numbers.** Decimal arithmetic runs in one fixed context after sorting its operands;
  floats are summed with ``math.fsum`` (exactly rounded). Neither depends on input order.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import blake3
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from keel.built import built
from keel.digest import canonical_json, canonical_text, digest_bytes, digest_json
from keel.mrp.dsl import JobSpec, ParsedJob
from keel.mrp.errors import DslError, DslIssue
from keel.mrp.records import FileRef, RecordSlice

T = TypeVar("T")

# ---------------------------------------------------------------------------------------
# Numeric policy

DECIMAL_PRECISION = 34  # IEEE 754 decimal128: 34 significant digits
DECIMAL_CONTEXT = decimal.Context(
    prec=DECIMAL_PRECISION,
    rounding=decimal.ROUND_HALF_EVEN,
    Emin=-999_999,
    Emax=999_999,
    capitals=1,
    clamp=0,
    flags=[],
    traps=[decimal.InvalidOperation, decimal.DivisionByZero, decimal.Overflow],
)


def decimal_context() -> decimal.Context:
    """A fresh copy of the fixed context (copies keep flags from leaking between calls)."""
    return DECIMAL_CONTEXT.copy()


def to_decimal(value: Decimal | int | float | str) -> Decimal:
    """Convert exactly to a finite Decimal.

    Floats go through their shortest ``repr`` (``0.1`` becomes ``Decimal('0.1')``, not the
    binary expansion), so a value read from JSON converts the same way everywhere. Bools,
    NaN and infinities are refused: they have no place in an amount.
    """
    if isinstance(value, bool):
        raise TypeError("bool is not a number here")
    if isinstance(value, Decimal):
        d = value
    elif isinstance(value, int):
        d = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r}")
        d = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            d = Decimal(value)
        except decimal.InvalidOperation:
            raise ValueError(f"not a decimal number: {value!r}") from None
    else:
        raise TypeError(f"cannot convert {type(value).__name__} to Decimal")
    if not d.is_finite():
        raise ValueError(f"non-finite decimal {value!r}")
    return d


def _canonical_decimals(values: Iterable[Decimal | int | float | str]) -> list[Decimal]:
    # Sorting by value, then by text (1.0 and 1.00 are equal but print differently), makes
    # the operand order a function of the multiset alone, so rounding is order-free too.
    return sorted((to_decimal(v) for v in values), key=lambda d: (d, str(d)))


def decimal_sum(values: Iterable[Decimal | int | float | str]) -> Decimal:
    """Sum in the fixed context; the result does not depend on the order of ``values``."""
    ctx = decimal_context()
    total = Decimal(0)
    for d in _canonical_decimals(values):
        total = ctx.add(total, d)
    return total


def decimal_mean(values: Iterable[Decimal | int | float | str]) -> Decimal:
    """Mean in the fixed context; :class:`ValueError` for no values."""
    ds = _canonical_decimals(values)
    if not ds:
        raise ValueError("mean of no values")
    return decimal_context().divide(decimal_sum(ds), Decimal(len(ds)))


def decimal_mul(a: Decimal | int | float | str, b: Decimal | int | float | str) -> Decimal:
    """Product in the fixed context."""
    return decimal_context().multiply(to_decimal(a), to_decimal(b))


def quantize(value: Decimal | int | float | str, places: int) -> Decimal:
    """Round half-even to ``places`` decimal places (the fixed text form of an amount)."""
    if places < 0:
        raise ValueError("places must be >= 0")
    exp = Decimal(1).scaleb(-places)
    return to_decimal(value).quantize(
        exp, rounding=decimal.ROUND_HALF_EVEN, context=decimal_context()
    )


def _finite_floats(values: Iterable[float | int]) -> list[float]:
    out: list[float] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"expected a number, got {type(v).__name__}")
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"non-finite value {v!r}")
        out.append(f)
    return out


def float_sum(values: Iterable[float | int]) -> float:
    """``math.fsum``: the exactly rounded sum, hence independent of order.

    A zero result is returned as ``0.0`` (never ``-0.0``), whose sign would otherwise
    depend on which zero came first.
    """
    total = math.fsum(_finite_floats(values))
    return 0.0 if total == 0 else total


def float_mean(values: Iterable[float | int]) -> float:
    """Exactly rounded sum divided by the count; :class:`ValueError` for no values."""
    fs = _finite_floats(values)
    if not fs:
        raise ValueError("mean of no values")
    return float_sum(fs) / len(fs)


def canonical_sorted(values: Iterable[T]) -> list[T]:
    """Values sorted by their canonical JSON, for reductions over sets (unions, counts)."""
    return sorted(values, key=canonical_json)


def in_shard_order(outputs: Mapping[int, T], shard_count: int) -> list[T]:
    """Shard outputs by shard index; :class:`ValueError` unless indexes are 0..count-1.

    A reducer must see every shard exactly once and always in the same order, whatever
    order the map phase finished in.
    """
    expected = set(range(shard_count))
    got = set(outputs)
    if got != expected:
        missing = sorted(expected - got)[:10]
        extra = sorted(got - expected)[:10]
        raise ValueError(f"shard outputs do not match the plan (missing {missing}, extra {extra})")
    return [outputs[i] for i in range(shard_count)]


# ---------------------------------------------------------------------------------------
# Seeds

# BLAKE3 derive-key context: fixed for all time, so seeds only change when their inputs do.
SEED_CONTEXT = "keel.mrp 2026-01 seed derivation v1"
SEED_BITS = 63  # fits a signed 64-bit integer; take ``seed % 2**32`` for 32-bit RNGs


def _seed_of(material: Any) -> int:
    digest = blake3.blake3(canonical_json(material), derive_key_context=SEED_CONTEXT).digest(
        length=8
    )
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def derive_job_seed(
    dsl_version: str, job_id: str, inputs_digest: str, operator_versions: Mapping[str, str]
) -> int:
    """The job seed from ``(dsl_version, job_id, inputs_digest, {role: name@version})``."""
    return _seed_of(
        {
            "dsl_version": dsl_version,
            "job_id": job_id,
            "inputs_digest": inputs_digest,
            "operators": dict(operator_versions),
        }
    )


def derive_seed(parent_seed: int, label: str) -> int:
    """A child seed: ``label`` is a phase name or ``map:<shard input digest>``.

    The canonical JSON of ``{"parent": parent_seed, "label": label}``, written out (one
    is made per shard: ``json.dumps`` of the dict was most of a shard's compile)."""
    text = f'{{"label":{canonical_text(label)},"parent":{int(parent_seed)}}}'
    digest = blake3.blake3(text.encode("utf-8"), derive_key_context=SEED_CONTEXT).digest(length=8)
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def shard_seed(job_seed: int, input_digest: str) -> int:
    """Seed of a map shard. It follows the shard's content, not its position."""
    return derive_seed(job_seed, f"map:{input_digest}")


# ---------------------------------------------------------------------------------------
# Inputs and shards


class ShardInput(BaseModel):
    """What one map invocation reads: inline items, file references, or one slice of a
    record file's records (exactly one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: list[JsonValue] | None = None
    files: list[FileRef] | None = None
    records: RecordSlice | None = None

    @model_validator(mode="after")
    def _one(self) -> ShardInput:
        given = [v for v in (self.items, self.files, self.records) if v is not None]
        if len(given) != 1:
            raise ValueError("a shard input holds items, files or records")
        return self

    def canonical(self) -> dict[str, Any]:
        """The JSON form that is digested and stored."""
        return self.model_dump(mode="json", exclude_none=True)

    def canonical_bytes(self) -> bytes:
        """:meth:`canonical` as canonical JSON: the bytes stored and digested. An input of
        items is ``{"items": [...]}`` written out (its items are JSON values, which the
        dump passes as they are: one is made per shard, and the dump was most of it)."""
        if self.items is not None and self.files is None and self.records is None:
            return b'{"items":' + canonical_json(self.items) + b"}"
        return canonical_json(self.canonical())

    def digest(self) -> str:
        """``blake3:`` digest of :meth:`canonical`."""
        return digest_bytes(self.canonical_bytes())

    @property
    def item_count(self) -> int:
        """Items, files or records in the shard."""
        if self.records is not None:
            return self.records.record_count
        return len(self.items if self.items is not None else self.files or [])


class Shard(BaseModel):
    """One shard of the plan: its position, its input and the input's digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    input: ShardInput
    input_digest: str
    # ``input``'s canonical JSON, the bytes digested (``of``): the compile packs them.
    payload: bytes = Field(default=b"", exclude=True, repr=False)

    @classmethod
    def of(cls, index: int, shard_input: ShardInput) -> Shard:
        """Shard ``index`` of ``shard_input``, its canonical JSON made once."""
        if index < 0:
            raise ValueError("a shard index is >= 0")
        data = shard_input.canonical_bytes()
        return built(
            cls, index=index, input=shard_input, input_digest=digest_bytes(data), payload=data
        )


def make_shards(units: Sequence[Any], per_shard: int, *, json_items: bool = False) -> list[Shard]:
    """Cut ``units`` (JSON items or :class:`FileRef` files, in canonical order) into shards.

    ``json_items``: the units are a job's checked ``inputs.items`` (``FiniteJson``), so a
    shard's input is built without checking each item again."""
    if per_shard < 1:
        raise ValueError("per_shard must be >= 1")
    shards: list[Shard] = []
    for index, start in enumerate(range(0, len(units), per_shard)):
        chunk = list(units[start : start + per_shard])
        if chunk and isinstance(chunk[0], FileRef):
            si = ShardInput(files=[f for f in chunk if isinstance(f, FileRef)])
        elif json_items and chunk:
            si = built(ShardInput, items=chunk, files=None, records=None)
        else:
            si = ShardInput(items=chunk)
        shards.append(Shard.of(index, si))
    return shards


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a path glob: ``*`` and ``?`` stay within one segment, ``**`` spans any.

    ``[abc]`` and ``[!abc]`` are character classes; everything else is literal. The
    compile activity expands globs the same way, and the compiler checks its answer.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            body = body.replace("\\", "\\\\")
            if body.startswith("^"):
                body = "\\" + body
            # A class never matches "/", as in glob: it stays within one path segment.
            out.append("[^/" + body + "]" if negate else "(?!/)[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("^" + "".join(out) + "$")


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """:func:`glob_regex` of an input pattern; ``s3://bucket/prefix/`` (a trailing ``/``)
    matches every object under the prefix."""
    return glob_regex(pattern + "**" if pattern.endswith("/") else pattern)


def resolve_files(
    patterns: Sequence[str],
    resolved: Iterable[FileRef],
    lines: Mapping[str, int] | None = None,
) -> list[FileRef]:
    """Check the activity's file listing against the patterns; return it in canonical order.

    Every pattern must match at least one file (an empty glob is almost always a mistake),
    every file must match a pattern, and a path listed twice must have one digest.
    """
    lines = lines or {}
    issues: list[DslIssue] = []
    regexes = [pattern_regex(p) for p in patterns]
    by_path: dict[str, FileRef] = {}
    for f in resolved:
        prior = by_path.get(f.path)
        if prior is not None and prior != f:
            issues.append(
                DslIssue(
                    path="inputs.files",
                    line=lines.get("inputs.files"),
                    message=f"file {f.path!r} was resolved twice with different content",
                )
            )
        by_path[f.path] = f
    for path in sorted(by_path):
        if not any(rx.match(path) for rx in regexes):
            issues.append(
                DslIssue(
                    path="inputs.files",
                    line=lines.get("inputs.files"),
                    message=f"resolved file {path!r} matches no pattern",
                )
            )
    for i, (pattern, rx) in enumerate(zip(patterns, regexes, strict=True)):
        if not any(rx.match(path) for path in by_path):
            issues.append(
                DslIssue(
                    path=f"inputs.files[{i}]",
                    line=lines.get(f"inputs.files[{i}]"),
                    message=f"pattern {pattern!r} matched no files",
                )
            )
    if issues:
        raise DslError(issues)
    return [by_path[p] for p in sorted(by_path)]


def inputs_digest_of(units: Sequence[Any], record_format: str | None = None) -> str:
    """Digest of the job's inputs (JSON items or :class:`FileRef` files, and the record
    format files are read in, if any), whatever the sharding."""
    if units and isinstance(units[0], FileRef):
        files = [f.model_dump(mode="json") for f in units if isinstance(f, FileRef)]
        if record_format is not None:
            return digest_json({"files": files, "format": record_format})
        return digest_json({"files": files})
    return digest_json({"items": [digest_json(item) for item in units]})


class NormalizedJob(BaseModel):
    """A validated job in canonical form, with its inputs resolved and sharded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: JobSpec
    job_digest: str
    inputs_digest: str
    item_count: int
    shards: list[Shard]

    @property
    def shard_count(self) -> int:
        """Number of map shards."""
        return len(self.shards)


def record_shards(
    parsed: ParsedJob, files: Sequence[FileRef], slices: Iterable[RecordSlice]
) -> list[Shard]:
    """Check the compile activity's record slices against the job and its files; one
    shard per slice, ordered by file path and first record.

    Each slice must name a listed file with its digest, the job's format and malformed
    policy, and each file's slices must cover its records from the first, in order,
    without gaps (a file with no records has none). :class:`DslError` otherwise, and when
    the files hold no records at all (a job needs at least one shard).
    """
    spec = parsed.spec.inputs
    by_path = {f.path: f for f in files}
    ordered = sorted(slices, key=lambda s: (s.file.path, s.first_record))
    problems: list[str] = []
    next_record: dict[str, int] = {}
    for s in ordered:
        if by_path.get(s.file.path) != s.file:
            problems.append(f"slice of {s.file.path!r} names a file the listing does not have")
        elif s.format != spec.format or s.on_malformed != spec.malformed_policy:
            problems.append(f"slice of {s.file.path!r} has another format or policy")
        elif s.first_record != next_record.get(s.file.path, 0):
            problems.append(f"slices of {s.file.path!r} leave a gap or overlap")
        next_record[s.file.path] = s.first_record + s.record_count
    if not problems and not ordered:
        problems.append(
            f"the input files hold no {spec.format} records (empty, or a header only): "
            "a job needs at least one record"
        )
    if problems:
        line = parsed.line("inputs.files")
        raise DslError(
            [DslIssue(path="inputs.files", line=line, message=m) for m in problems[:20]],
            parsed.source,
        )
    shards = []
    for index, s in enumerate(ordered):
        si = ShardInput(records=s)
        shards.append(Shard.of(index, si))
    return shards


def normalize_job(
    parsed: ParsedJob,
    resolved_files: Iterable[FileRef] | None = None,
    record_slices: Iterable[RecordSlice] | None = None,
) -> NormalizedJob:
    """Canonicalise a parsed job and cut its inputs into shards.

    Jobs with ``inputs.files`` need ``resolved_files`` from the compile activity, and
    jobs with ``inputs.format`` its ``record_slices`` too; without them this raises
    :class:`DslError` rather than guess.
    """
    spec = parsed.spec
    units: list[JsonValue] | list[FileRef]
    if spec.inputs.items is not None:
        units = list(spec.inputs.items)
    else:
        missing = resolved_files is None or (
            spec.inputs.format is not None and record_slices is None
        )
        if missing:
            raise DslError(
                [
                    DslIssue(
                        path="inputs.files",
                        line=parsed.line("inputs.files"),
                        message="file inputs must be resolved (listed and hashed, and record "
                        "files cut into slices) before compiling; the compile activity "
                        "does this",
                    )
                ],
                parsed.source,
            )
        assert resolved_files is not None
        try:
            units = resolve_files(spec.inputs.files or [], resolved_files, parsed.lines)
        except DslError as e:
            raise DslError(e.issues, parsed.source) from None
    if spec.inputs.format is not None:
        assert record_slices is not None
        files = [u for u in units if isinstance(u, FileRef)]
        shards = record_shards(parsed, files, record_slices)
        return NormalizedJob(
            spec=spec,
            job_digest=digest_json(spec),
            inputs_digest=inputs_digest_of(files, spec.inputs.format),
            item_count=sum(s.input.item_count for s in shards),
            shards=shards,
        )
    shards = make_shards(
        units, spec.inputs.items_per_shard, json_items=spec.inputs.items is not None
    )
    return NormalizedJob(
        spec=spec,
        job_digest=digest_json(spec),
        inputs_digest=inputs_digest_of(units),
        item_count=len(units),
        shards=shards,
    )
