"""Invocation with schema checks and the egress guard, and the phase's operator handle."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import JsonValue
from temporalio.exceptions import ApplicationError

from activities.mrp.egress import EgressDenied, egress_guard
from activities.mrp.operators.config import MrpConfig, OperatorHandle
from activities.mrp.operators.loading import _BASES
from keel.digest import canonical_json, digest_bytes
from keel.mrp.dsl import SinkSpec
from keel.mrp.errors import RegistryError
from keel.mrp.ir import JobIR
from keel.mrp.registry import OperatorKind, OperatorSpec
from keel.mrp.run import ERROR_COMPILE
from keel.mrp.sdk import (
    AgentBase,
    Evaluation,
    EvaluatorBase,
    OperatorBase,
    OperatorContext,
    OperatorError,
    ProducedFile,
    ProducerBase,
    ProduceResult,
    ReducerBase,
    SchemaViolation,
    StreamingReducerBase,
    file_writer,
)

if TYPE_CHECKING:
    pass


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


def _checked(
    spec: OperatorSpec,
    ctx: OperatorContext,
    inputs: list[JsonValue],
    input_label: str,
    call: Callable[[], Any],
    output_label: str,
) -> JsonValue:
    """A map or reduce call checked at both ends: the params and each input against the
    spec's schemas, the call guarded, its output canonical JSON and against
    ``output_schema``."""
    _check(spec, "params", ctx.params)
    for i, value in enumerate(inputs):
        _check(spec, "input", value, f"{input_label} {i}:")
    out = _run(spec, call)
    _check_json(spec, out, output_label)
    _check(spec, "output", out)
    return out  # type: ignore[no-any-return]


def invoke_map(
    spec: OperatorSpec, instance: OperatorBase, items: list[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a map operator on one shard: params and every item checked against the schemas,
    the call guarded, the output checked against ``output_schema`` and canonical JSON."""
    _expect(spec, instance, OperatorKind.MAP)
    assert isinstance(instance, AgentBase)
    return _checked(spec, ctx, items, "item", lambda: instance.map(items, ctx), "map output")


def _sample_rows(table: Any) -> list[JsonValue]:
    """The first and last rows of an Arrow table as the records the per-record path gives
    (``activities.mrp.records``), for the batch path's schema check."""
    from activities.mrp.records import _row_record

    n = table.num_rows
    picks = [0, n - 1] if n > 1 else list(range(n))
    return [_row_record(table.slice(i, 1).to_pylist()[0]) for i in picks]


def invoke_map_arrow(
    spec: OperatorSpec, instance: OperatorBase, table: Any, ctx: OperatorContext
) -> JsonValue:
    """Run a ``batch: arrow`` map operator on one shard given whole as an Arrow table: the
    params checked, the table's first and last rows checked against ``input_schema`` as
    records (not every row: the per-item check is what the batch path saves; the
    operator reads typed columns), the call guarded, the output checked as
    :func:`invoke_map` checks it."""
    _expect(spec, instance, OperatorKind.MAP)
    assert isinstance(instance, AgentBase)
    if spec.batch != "arrow":
        raise OperatorError(spec.ref, "does not take Arrow batches (batch: arrow)", retryable=False)
    return _checked(
        spec, ctx, _sample_rows(table), "row", lambda: instance.map_arrow(table, ctx), "map output"
    )


class _CheckedOutputs(Sequence[JsonValue]):
    """Shard outputs read lazily, each checked against ``input_schema`` when read."""

    def __init__(self, spec: OperatorSpec, outputs: Sequence[JsonValue]) -> None:
        self.spec = spec
        self.outputs = outputs

    def __len__(self) -> int:
        return len(self.outputs)

    def _checked(self, i: int, value: JsonValue) -> JsonValue:
        _check(self.spec, "input", value, f"shard output {i}:")
        return value

    def __iter__(self) -> Iterator[JsonValue]:
        for i, value in enumerate(self.outputs):
            yield self._checked(i, value)

    @overload
    def __getitem__(self, index: int) -> JsonValue: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[JsonValue]: ...

    def __getitem__(self, index: int | slice) -> JsonValue | Sequence[JsonValue]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        return self._checked(i, self.outputs[index])


def invoke_reduce(
    spec: OperatorSpec, instance: OperatorBase, outputs: Sequence[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a reducer: each shard output checked against ``input_schema``, result against
    ``output_schema``. A :class:`StreamingReducerBase` gets ``outputs`` as they are (a
    lazy sequence streams), each checked as it is read; any other reducer gets them all
    in a list, checked first."""
    _expect(spec, instance, OperatorKind.REDUCE)
    assert isinstance(instance, ReducerBase)
    if isinstance(instance, StreamingReducerBase):
        lazy = _CheckedOutputs(spec, outputs)
        return _checked(
            spec, ctx, [], "", lambda: instance.reduce_stream(lazy, ctx), "reduce output"
        )
    listed = outputs if isinstance(outputs, list) else list(outputs)
    return _checked(
        spec, ctx, listed, "shard output", lambda: instance.reduce(listed, ctx), "reduce output"
    )


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
    with file_writer(write_output):
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


def phase_handle(config: MrpConfig, ir: JobIR, role: str) -> OperatorHandle:
    """The operator of ``role``, refused unless its code is the code the IR was compiled
    with (a changed operator mid-run or since the original run fails here)."""
    binding = ir.operators[role]
    try:
        handle = config.handle(binding.ref)
    except RegistryError as e:
        raise ApplicationError(
            f"{role} operator {binding.ref} is refused: {e}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        ) from None
    if handle.spec.code_digest != binding.code_digest:
        raise ApplicationError(
            f"{role} operator {binding.ref}: its code is now {handle.spec.code_digest}, "
            f"but this run was compiled with {binding.code_digest}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        )
    return handle


def write_output(out_dir: Path, rel_path: str, data: bytes) -> ProducedFile:
    """Write ``data`` to ``out_dir/rel_path`` atomically (temp file + rename); return the
    :class:`ProducedFile` with its digest and size (what ``keel.mrp.sdk.write_output``
    does inside a produce call)."""
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
