"""The operator SDK: what operator code subclasses and what the runtime hands it.

An operator is a folder with an ``operator.yaml`` (:class:`~keel.mrp.registry.OperatorSpec`)
and Python code. Its ``entrypoint`` is ``module:Class``, the module path taken *relative to
the operator's folder* (``agent:WordCount`` is ``<folder>/agent.py``), so the code that runs
is the code that ``code_digest`` covers. The class subclasses one of:

- :class:`AgentBase` (kind ``map``): ``map(items, ctx)`` -> one JSON output per shard;
- :class:`ReducerBase` (``reduce``): ``reduce(outputs, ctx)``, outputs in shard-index order;
- :class:`EvaluatorBase` (``evaluate``): ``evaluate(reduced, ctx)`` -> :class:`Evaluation`;
- :class:`ProducerBase` (``produce``): ``produce(reduced, sink, out_dir, ctx)`` ->
  :class:`ProduceResult`, writing its files (and an audit log) under ``out_dir``.

Every call gets an :class:`OperatorContext`: params, seed, a seeded ``random.Random``, the
shard id, a file reader for ``inputs.files`` shards, a log, and an :class:`LLMClient`, the
only network an operator has (``keel.mrp.egress`` refuses every other connection while
operator code runs).

The runtime does not call the methods directly: :func:`invoke_map`, :func:`invoke_reduce`,
:func:`invoke_evaluate` and :func:`invoke_produce` check params, inputs and outputs against
the operator's JSON Schemas, check that the output is canonical JSON, and run the call under
the egress guard. Their failures are :class:`OperatorError` (or :class:`SchemaViolation`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import random
import re
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from keel.digest import canonical_json, is_digest
from keel.llm import LLMUsage
from keel.mrp.dsl import SinkSpec
from keel.mrp.egress import EgressDenied, egress_guard
from keel.mrp.errors import MrpError, RegistryError
from keel.mrp.normalize import FileRef
from keel.mrp.registry import OperatorKind, OperatorSpec

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
    "audit_log_bytes",
    "invoke_evaluate",
    "invoke_map",
    "invoke_produce",
    "invoke_reduce",
    "load_operator",
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
    ``model`` (a name from the models config; empty for its default) and ``json_mode``.
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
    ) -> None:
        self.params: dict[str, JsonValue] = dict(params or {})
        self.seed = seed
        self.shard_id = shard_id
        self.rng = random.Random(seed)
        self.llm: LLMClient = llm if llm is not None else NoLLM(operator)
        self.operator = operator
        self.logs: list[str] = []
        self.charged_units = Decimal(0)
        self._file_reader = file_reader or _no_files
        self._log_sink = log_sink

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
        if not is_digest(v):
            raise ValueError("digest must be 'blake3:' followed by 64 lowercase hex digits")
        return v


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


class ReducerBase(OperatorBase):
    """A reduce operator: runs once over every shard output, in shard-index order."""

    kind = OperatorKind.REDUCE

    @abstractmethod
    def reduce(self, outputs: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        """The reduced value. Use Decimal or ``math.fsum`` (keel.mrp.normalize), never an
        unordered float sum."""


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
    itself when it is a relative path, else the last segment of the URI's path (the
    runtime copies ``out_dir`` to the URI)."""
    dest = sink.destination
    if "://" in dest:
        tail = dest.rstrip("/").rsplit("/", 1)[-1]
        return tail if _SAFE_REL.match(tail) and "://" not in tail else f"output.{sink.kind.value}"
    return dest


def write_output(out_dir: Path, rel_path: str, data: bytes) -> ProducedFile:
    """Write ``data`` to ``out_dir/rel_path`` atomically (temp file + rename); return the
    :class:`ProducedFile` with its digest and size."""
    import os

    from keel.digest import digest_bytes

    produced = ProducedFile(path=rel_path, digest=digest_bytes(data), size=len(data))
    target = out_dir / rel_path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return produced


def audit_log_bytes(records: list[dict[str, JsonValue]]) -> bytes:
    """JSON Lines of ``records``, each canonical JSON: the same records give the same bytes
    (so audit logs carry no wall-clock time; the run manifest records when)."""
    return b"".join(canonical_json(r) + b"\n" for r in records)


_BASES: dict[OperatorKind, type[OperatorBase]] = {
    OperatorKind.MAP: AgentBase,
    OperatorKind.REDUCE: ReducerBase,
    OperatorKind.EVALUATE: EvaluatorBase,
    OperatorKind.PRODUCE: ProducerBase,
}


# ---------------------------------------------------------------------------------------
# Loading


_PACKAGE_ROOT = "keel_mrp_operators"
_load_lock = threading.RLock()
_loaded: dict[tuple[str, str, str], OperatorBase] = {}


def _package_name(spec: OperatorSpec, folder: Path) -> str:
    # One module namespace per (operator, code digest, folder): two versions of one
    # operator, or a changed copy of it, never share (or overwrite) a module.
    tag = hashlib.sha256(f"{spec.code_digest}\0{folder}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_]", "_", f"{spec.name}_{spec.version}")
    return f"{_PACKAGE_ROOT}.{safe}_{tag}"


def _import_package(name: str, folder: Path) -> None:
    if _PACKAGE_ROOT not in sys.modules:
        root = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec(_PACKAGE_ROOT, None, is_package=True)
        )
        root.__path__ = []
        sys.modules[_PACKAGE_ROOT] = root
    if name in sys.modules:
        return
    init = folder / "__init__.py"
    if init.is_file():
        mspec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )
    else:
        mspec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mspec.submodule_search_locations = [str(folder)]
    if mspec is None:
        raise RegistryError(f"cannot import operator code from {folder}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module
    try:
        if mspec.loader is not None:
            mspec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def load_operator(
    spec: OperatorSpec, folder: str | Path | None = None, *, verify: bool = True
) -> OperatorBase:
    """Import ``spec.entrypoint`` from the operator's folder and return an instance.

    ``folder`` is the directory holding the ``operator.yaml``; None looks the operator up
    on the default search path (``keel.mrp.operators_io.find_operator_dir``). With
    ``verify`` the folder's code is hashed first and must match ``spec.code_digest``, so
    the code that runs is the code that was pinned and signed. Instances are cached per
    process (operators must not keep per-call state on ``self``).

    Raises :class:`~keel.mrp.errors.RegistryError` (code does not match its pin, module or
    class missing, wrong kind).
    """
    from keel.mrp import operators_io  # the I/O side; imported late to avoid a cycle

    path = Path(folder).resolve() if folder is not None else operators_io.find_operator_dir(spec)
    key = (spec.ref, spec.code_digest, str(path))
    with _load_lock:
        cached = _loaded.get(key)
        if cached is not None:
            return cached
        if verify:
            actual = operators_io.code_digest(path)
            if actual != spec.code_digest:
                raise RegistryError(
                    f"operator {spec.ref}: code in {path} has digest {actual}, "
                    f"but its pin is {spec.code_digest}; re-sign it or restore the code"
                )
        module_rel, _, attr = spec.entrypoint.partition(":")
        package = _package_name(spec, path)
        try:
            _import_package(package, path)
            module = importlib.import_module(f"{package}.{module_rel}")
        except ImportError as e:
            raise RegistryError(
                f"operator {spec.ref}: cannot import {module_rel!r} from {path}: {e}"
            ) from None
        target = getattr(module, attr, None)
        if target is None:
            raise RegistryError(
                f"operator {spec.ref}: module {module_rel!r} has no attribute {attr!r}"
            )
        base = _BASES[spec.kind]
        if not (isinstance(target, type) and issubclass(target, base)):
            raise RegistryError(
                f"operator {spec.ref}: entrypoint {spec.entrypoint} must be a subclass of "
                f"{base.__name__} (kind {spec.kind.value})"
            )
        instance = target()
        _loaded[key] = instance
        return instance


# ---------------------------------------------------------------------------------------
# Invocation with schema checks and the egress guard


def _problems(spec: OperatorSpec, which: Literal["input", "output", "params"], v: Any) -> list[str]:
    out = []
    for p in spec.schema_errors(which, v):
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in p.path)
        out.append(f"{where.lstrip('.') or '<root>'}: {p.message}")
    return out


def _check(
    spec: OperatorSpec,
    which: Literal["input", "output", "params"],
    value: Any,
    label: str = "",
) -> None:
    problems = _problems(spec, which, value)
    if problems:
        if label:
            problems = [f"{label} {p}" for p in problems]
        # Bad output is the operator's fault, and a retry of a seeded operator gives the
        # same answer: no schema failure is retryable.
        raise SchemaViolation(spec.ref, which, problems)


def _check_json(spec: OperatorSpec, value: Any, what: str) -> None:
    try:
        canonical_json(value)
    except (TypeError, ValueError) as e:
        raise OperatorError(
            spec.ref, f"{what} is not canonical JSON: {e}", retryable=False
        ) from None


def _expect(spec: OperatorSpec, instance: OperatorBase, kind: OperatorKind) -> None:
    if spec.kind is not kind or not isinstance(instance, _BASES[kind]):
        raise OperatorError(
            spec.ref, f"is a {spec.kind.value} operator, not {kind.value}", retryable=False
        )


def _run(spec: OperatorSpec, fn: Callable[[], Any]) -> Any:
    try:
        with egress_guard(spec.ref, allowed=spec.egress):
            return fn()
    except OperatorError:
        raise
    except EgressDenied as e:
        # Policy, not bad luck: running it again would be refused again.
        raise OperatorError(spec.ref, str(e), retryable=False) from e
    except Exception as e:
        raise OperatorError(spec.ref, f"{type(e).__name__}: {e}") from e


def invoke_map(
    spec: OperatorSpec, instance: OperatorBase, items: list[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a map operator on one shard: params and every item checked against the schemas,
    the call guarded, the output checked against ``output_schema`` and canonical JSON."""
    _expect(spec, instance, OperatorKind.MAP)
    _check(spec, "params", ctx.params)
    for i, item in enumerate(items):
        _check(spec, "input", item, f"item {i}:")
    assert isinstance(instance, AgentBase)
    out = _run(spec, lambda: instance.map(items, ctx))
    _check_json(spec, out, "map output")
    _check(spec, "output", out)
    return out  # type: ignore[no-any-return]


def invoke_reduce(
    spec: OperatorSpec, instance: OperatorBase, outputs: list[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a reducer: each shard output checked against ``input_schema``, result against
    ``output_schema``."""
    _expect(spec, instance, OperatorKind.REDUCE)
    _check(spec, "params", ctx.params)
    for i, o in enumerate(outputs):
        _check(spec, "input", o, f"shard output {i}:")
    assert isinstance(instance, ReducerBase)
    out = _run(spec, lambda: instance.reduce(outputs, ctx))
    _check_json(spec, out, "reduce output")
    _check(spec, "output", out)
    return out  # type: ignore[no-any-return]


def invoke_evaluate(
    spec: OperatorSpec, instance: OperatorBase, reduced: JsonValue, ctx: OperatorContext
) -> Evaluation:
    """Run an evaluator on the reduced value (checked against ``input_schema``)."""
    _expect(spec, instance, OperatorKind.EVALUATE)
    _check(spec, "params", ctx.params)
    _check(spec, "input", reduced)
    assert isinstance(instance, EvaluatorBase)
    out = _run(spec, lambda: instance.evaluate(reduced, ctx))
    if not isinstance(out, Evaluation):
        raise OperatorError(spec.ref, "evaluate must return an Evaluation", retryable=False)
    return out


def invoke_produce(
    spec: OperatorSpec,
    instance: OperatorBase,
    reduced: JsonValue,
    sink: SinkSpec,
    out_dir: Path,
    ctx: OperatorContext,
) -> ProduceResult:
    """Run a producer: the sink kind must be one the operator writes; every listed file
    must exist under ``out_dir`` with the digest and size it claims."""
    from keel.digest import digest_bytes

    _expect(spec, instance, OperatorKind.PRODUCE)
    if sink.kind not in spec.sinks:
        raise OperatorError(
            spec.ref,
            f"does not write {sink.kind.value} sinks (writes {spec.sinks})",
            retryable=False,
        )
    _check(spec, "params", ctx.params)
    _check(spec, "input", reduced)
    assert isinstance(instance, ProducerBase)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = _run(spec, lambda: instance.produce(reduced, sink, out_dir, ctx))
    if not isinstance(out, ProduceResult):
        raise OperatorError(spec.ref, "produce must return a ProduceResult", retryable=False)
    for f in out.files:
        data = (out_dir / f.path).read_bytes()
        if digest_bytes(data) != f.digest or len(data) != f.size:
            raise OperatorError(
                spec.ref, f"file {f.path} does not match the digest/size it reported"
            )
    return out
