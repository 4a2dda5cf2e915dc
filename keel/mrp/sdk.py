"""The operator SDK: what operator code subclasses and what the runtime hands it.

An operator is a folder with an ``operator.yaml`` (:class:`~keel.mrp.registry.OperatorSpec`)
and Python code. Its ``entrypoint`` is ``module:Class``, the module path taken *relative to
the operator's folder* (``agent:WordCount`` is ``<folder>/agent.py``), so the code that runs
is the code that ``code_digest`` covers. The class subclasses one of:

- :class:`AgentBase` (kind ``map``): ``map(items, ctx)`` -> one JSON output per shard
  (and, with ``batch: arrow``, ``map_arrow(table, ctx)`` for Parquet shards);
- :class:`ReducerBase` (``reduce``): ``reduce(outputs, ctx)``, outputs in shard-index order;
- :class:`EvaluatorBase` (``evaluate``): ``evaluate(reduced, ctx)`` -> :class:`Evaluation`;
- :class:`ProducerBase` (``produce``): ``produce(reduced, sink, out_dir, ctx)`` ->
  :class:`ProduceResult`, writing its files (and an audit log) under ``out_dir``.

Every call gets an :class:`OperatorContext`: params, seed, a seeded ``random.Random``, the
shard id, a file reader for ``inputs.files`` shards, a log, and an :class:`LLMClient`, the
only network an operator has (``activities.mrp.egress`` refuses every other connection while
operator code runs).

The runtime does not call the methods directly: ``activities.mrp.operators`` loads the
code (``load_operator``) and its ``invoke_map``, ``invoke_reduce``, ``invoke_evaluate`` and
``invoke_produce`` check params, inputs and outputs against the operator's JSON Schemas,
check that the output is canonical JSON, and run the call under the egress guard. Their
failures are :class:`OperatorError` (or :class:`SchemaViolation`).

This module is what operator code imports; it holds no loading or guarding machinery.
:func:`write_output` is what producers call to write under the ``out_dir`` the runtime gives
them; the runtime's writer (set with :func:`file_writer` around the call) does the writing.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from random import Random
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from keel.digest import canonical_json, checked_digest
from keel.llm import LLMUsage
from keel.mrp.dsl import SinkSpec
from keel.mrp.errors import MrpError
from keel.mrp.normalize import FileRef
from keel.mrp.registry import OperatorKind

__all__ = [
    "AgentBase",
    "Evaluation",
    "EvaluatorBase",
    "LLMClient",
    "LLMResult",
    "LLMUnavailable",
    "NoLLM",
    "OperatorBase",
    "OperatorContext",
    "OperatorError",
    "ProduceResult",
    "ProducedFile",
    "ProducerBase",
    "ReducerBase",
    "SchemaViolation",
    "StreamingReducerBase",
    "audit_log_bytes",
    "file_writer",
    "sink_file_name",
    "write_output",
]


# ---------------------------------------------------------------------------------------
# Errors


class OperatorError(MrpError):
    """Operator code failed, or broke its contract (wrong kind, bad output, bad schema).

    ``operator`` is ``name@version``; ``retryable`` says whether running it again could help
    (an exception from operator code: yes; a schema mismatch on the inputs: no).
    """

    def __init__(self, operator: str, message: str, *, retryable: bool = True) -> None:
        self.operator = operator
        self.retryable = retryable
        super().__init__(f"operator {operator}: {message}")


class SchemaViolation(OperatorError):
    """A value does not match one of the operator's JSON Schemas."""

    def __init__(
        self,
        operator: str,
        which: Literal["input", "output", "params"],
        problems: list[str],
        *,
        retryable: bool = False,
    ) -> None:
        self.which = which
        self.problems = problems
        super().__init__(
            operator,
            f"{which} does not match its schema: " + "; ".join(problems),
            retryable=retryable,
        )


class LLMUnavailable(OperatorError):
    """The operator asked for a model but has no LLM egress (or replay has no answer)."""

    def __init__(self, operator: str, message: str) -> None:
        super().__init__(operator, message, retryable=False)


# ---------------------------------------------------------------------------------------
# LLM client


class LLMResult(BaseModel):
    """One model answer as an operator sees it.

    ``cost_usd`` is None when neither the models config nor LiteLLM's price table knows the
    model's price; ``cached`` is True when the answer came from the request-digest cache
    (no model call was made and nothing was spent).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: str
    usage: LLMUsage = Field(default_factory=LLMUsage)
    cost_usd: Decimal | None = None
    cached: bool = False
    model_name: str = ""
    request_digest: str = ""
    finish_reason: str | None = None


@runtime_checkable
class LLMClient(Protocol):
    """The only egress an operator has.

    ``messages`` is a chat (``[{"role": "user", "content": "..."}]``) or one user prompt.
    ``params`` are model parameters (``temperature``, ``max_tokens``, ``seed``, ...) plus
    ``model`` (a name from the models config; empty for its default), ``json_mode`` and
    ``json_schema`` (a JSON Schema the answer must fit; the server decodes against it
    where the model's config says it can, and the operator still checks the answer).
    """

    def complete(self, messages: list[dict[str, str]] | str, **params: Any) -> LLMResult:
        """Ask the model once; equal requests may be answered from the cache."""
        ...


class NoLLM:
    """The client of an operator without ``llm`` egress: every call is refused."""

    def __init__(self, operator: str = "") -> None:
        self.operator = operator

    def complete(self, messages: list[dict[str, str]] | str, **params: Any) -> LLMResult:
        raise LLMUnavailable(
            self.operator or "?", "has no LLM client (its operator.yaml lists no 'llm' egress)"
        )


# ---------------------------------------------------------------------------------------
# Context


def _no_files(ref: FileRef) -> bytes:
    raise OperatorError("?", f"no file reader is configured (asked for {ref.path})")


class OperatorContext:
    """What one operator call gets from the runtime.

    Args:
        params: the job's params for this step (already checked against ``params_schema``).
        seed: the step's seed (per shard for map); ``rng`` is ``random.Random(seed)``.
        shard_id: ``shard-000007`` for map calls, None otherwise.
        llm: the LLM client; :class:`NoLLM` for operators without ``llm`` egress.
        file_reader: returns a file's bytes for an ``inputs.files`` shard; the runtime's
            reader checks the bytes against ``FileRef.digest``.
        log_sink: receives each :meth:`log` line as well; lines are kept in ``logs``.
    """

    def __init__(
        self,
        *,
        params: dict[str, JsonValue] | None = None,
        seed: int = 0,
        shard_id: str | None = None,
        llm: LLMClient | None = None,
        file_reader: Callable[[FileRef], bytes] | None = None,
        log_sink: Callable[[str], None] | None = None,
        operator: str = "",
        failed_shards: list[dict[str, JsonValue]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.params: dict[str, JsonValue] = dict(params or {})
        self.seed = seed
        self.shard_id = shard_id
        self._rng: Random | None = None
        self.llm: LLMClient = llm if llm is not None else NoLLM(operator)
        self.operator = operator
        self.logs: list[str] = []
        self.charged_units = Decimal(0)
        self._file_reader = file_reader or _no_files
        self._log_sink = log_sink
        # Shards that failed for good in a run that went on without them (map's
        # min_success_ratio < 1): ``{shard_id, shard_index, attempts, error}`` in shard
        # order, for the reduce, evaluate and produce steps; empty otherwise.
        self.failed_shards: list[dict[str, JsonValue]] = list(failed_shards or [])
        # The environment variables the operator's ``env:`` declares (the only ones its
        # process has): the same as ``os.environ`` inside the operator's process.
        self.env: dict[str, str] = dict(env or {})

    @property
    def rng(self) -> Random:
        """``random.Random(seed)``, made on first use: seeding one was about a tenth of a
        small shard's time in its host, for the many operators that never draw."""
        if self._rng is None:
            self._rng = Random(self.seed)
        return self._rng

    @rng.setter
    def rng(self, value: Random) -> None:
        self._rng = value

    def run_audit(self) -> dict[str, JsonValue]:
        """What a producer's audit record adds about the run: ``failed_shards`` (each with
        its error) when the run went on without some shards; ``{}`` otherwise, so audit
        logs of complete runs are what they always were."""
        if not self.failed_shards:
            return {}
        return {"failed_shards": list(self.failed_shards)}  # type: ignore[dict-item]

    def read_file(self, ref: FileRef) -> bytes:
        """The bytes of one input file of this shard."""
        return self._file_reader(ref)

    def charge(self, units: Decimal | int | str, reason: str = "") -> None:
        """Report cost units spent beyond ``cost_weight`` (a metered tool, say). The
        runtime adds :attr:`charged_units` to the call's cost, so the budget sees it."""
        amount = Decimal(units)
        if not amount.is_finite() or amount < 0:
            raise ValueError("charged units must be a finite number >= 0")
        self.charged_units += amount
        if reason:
            self.log(f"charged {amount} units: {reason}")

    def log(self, msg: str) -> None:
        """Record a log line (kept with the call's result; no secrets, no PII)."""
        line = str(msg)
        self.logs.append(line)
        if self._log_sink is not None:
            self._log_sink(line)


# ---------------------------------------------------------------------------------------
# Base classes and results


class Evaluation(BaseModel):
    """An evaluator's verdict: ``score`` in [0, 1] and the reasons behind it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: Decimal = Field(ge=0, le=1)
    reasons: list[str] = Field(default_factory=list)


_SAFE_REL = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")


class ProducedFile(BaseModel):
    """One file a producer wrote: path relative to ``out_dir``, BLAKE3 digest, size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    digest: str
    size: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if not _SAFE_REL.match(v) or any(p in (".", "..") for p in v.split("/")):
            raise ValueError(f"produced file path {v!r} must be relative, without '..'")
        return v

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return checked_digest(v, "digest")


class ProduceResult(BaseModel):
    """What a producer wrote: files (data and audit log), row count, audit records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: list[ProducedFile]
    rows: int = Field(ge=0)
    audit: list[dict[str, JsonValue]] = Field(default_factory=list)


class OperatorBase(ABC):
    """Common base of every operator class. Instances are created with no arguments."""

    kind: OperatorKind


class AgentBase(OperatorBase):
    """A map operator: runs once per shard."""

    kind = OperatorKind.MAP

    @abstractmethod
    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        """The shard's output (one JSON value) from its items (or ``FileRef`` dicts)."""

    def map_arrow(self, table: Any, ctx: OperatorContext) -> JsonValue:
        """The shard's output from its records as one ``pyarrow.Table`` (the columns the
        job selects, ``inputs.columns``, or all; malformed rows left out as ``map`` would
        not see them). Called instead of :meth:`map` for a Parquet shard when the
        operator's ``operator.yaml`` says ``batch: arrow``; every other shard still goes
        to :meth:`map`, which must give the same output for the same records."""
        raise NotImplementedError(f"{type(self).__name__} does not implement map_arrow")


class ReducerBase(OperatorBase):
    """A reduce operator: runs once over every shard output, in shard-index order."""

    kind = OperatorKind.REDUCE

    @abstractmethod
    def reduce(self, outputs: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        """The reduced value. Use Decimal or ``math.fsum`` (keel.mrp.normalize), never an
        unordered float sum. ``outputs`` holds every shard output at once; a reducer that
        can fold them one at a time should be a :class:`StreamingReducerBase`."""


class StreamingReducerBase(ReducerBase):
    """A reduce operator that reads the shard outputs as a stream, so the reduce runs in
    bounded memory whatever the shard count.

    ``outputs`` of :meth:`reduce_stream` is a read-only sequence: ``len(outputs)`` is the
    number of outputs, iterating it reads them from the artifact store in shard order, a
    batch (a few MB) at a time, each checked against ``input_schema`` as it is read;
    ``outputs[i]`` reads one. Fold them in one pass (or a few): ``list(outputs)`` would
    hold them all again.
    """

    @abstractmethod
    def reduce_stream(self, outputs: Sequence[JsonValue], ctx: OperatorContext) -> JsonValue:
        """The reduced value, from the outputs as they are read."""

    def reduce(self, outputs: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        return self.reduce_stream(outputs, ctx)


class EvaluatorBase(OperatorBase):
    """An evaluator: scores the reduced value; produce runs only if the score is high enough."""

    kind = OperatorKind.EVALUATE

    @abstractmethod
    def evaluate(self, reduced: JsonValue, ctx: OperatorContext) -> Evaluation:
        """Score in [0, 1] and reasons."""


class ProducerBase(OperatorBase):
    """A producer: writes the reduced value to a sink, plus an audit log, under ``out_dir``."""

    kind = OperatorKind.PRODUCE

    @abstractmethod
    def produce(
        self, reduced: JsonValue, sink: SinkSpec, out_dir: Path, ctx: OperatorContext
    ) -> ProduceResult:
        """Write the files; return them with their digests."""


def sink_file_name(sink: SinkSpec) -> str:
    """The file a producer writes for ``sink``, relative to ``out_dir``: the destination
    itself when it is a relative path, else the last segment of the URI's path, or
    ``output.<kind>`` for a URI ending in ``/`` (the runtime uploads ``out_dir``'s files
    under the URI's prefix)."""
    dest = sink.destination
    if "://" in dest and dest.endswith("/"):
        return f"output.{sink.kind.value}"  # a prefix: s3://bucket/folder/
    if "://" in dest:
        tail = dest.rstrip("/").rsplit("/", 1)[-1]
        return tail if _SAFE_REL.match(tail) and "://" not in tail else f"output.{sink.kind.value}"
    return dest


FileWriter = Callable[[Path, str, bytes], ProducedFile]
# The runtime's writer for the produce call running in this context (set by the runtime's
# ``invoke_produce``): the SDK names the helper, the runtime does the writing.
_file_writer: contextvars.ContextVar[FileWriter | None] = contextvars.ContextVar(
    "keel_mrp_file_writer", default=None
)


@contextlib.contextmanager
def file_writer(writer: FileWriter) -> Iterator[None]:
    """Make ``writer`` what :func:`write_output` calls in this context (the runtime does
    this around a producer's call)."""
    token = _file_writer.set(writer)
    try:
        yield
    finally:
        _file_writer.reset(token)


def write_output(out_dir: Path, rel_path: str, data: bytes) -> ProducedFile:
    """Write ``data`` to ``out_dir/rel_path`` atomically (temp file + rename); return the
    :class:`ProducedFile` with its digest and size. Only inside a produce call: the
    runtime's writer does the writing."""
    writer = _file_writer.get()
    if writer is None:
        raise OperatorError("?", "write_output is available inside a produce call only")
    return writer(out_dir, rel_path, data)


def audit_log_bytes(records: list[dict[str, JsonValue]]) -> bytes:
    """JSON Lines of ``records``, each canonical JSON: the same records give the same bytes
    (so audit logs carry no wall-clock time; the run manifest records when)."""
    return b"".join(canonical_json(r) + b"\n" for r in records)
