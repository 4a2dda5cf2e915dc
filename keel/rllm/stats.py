"""Run statistics of ``.rllm`` apps: the per-run record, the aggregate and the prediction.

Every finished run (success or failure) is stored as one :class:`RllmRunRecord`
(store/rllm_stats.py, table ``rllm_runs``). :func:`aggregate` turns the records of one
app, version and model into :class:`RllmStats`; :func:`predict` estimates how long an
app will take from its stats, summing over the apps it ``uses``. Everything here is pure
maths on plain values, so it is unit-tested without a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field

#: Version of the stats record layout; stored in every row and reported by ``RllmStats``.
STATS_SCHEMA_VERSION = 1

RunStatus = Literal["ok", "error"]


class RllmRunRecord(BaseModel):
    """One finished run of one app (a composed run writes one record per app).

    ``run_key`` is unique (workflow id and run id): recording twice is a no-op.
    ``input_valid`` is False when the run failed on its input (``InputSchemaError``) and
    None when it failed before the input was checked. ``output_valid`` is True when the
    final output matched ``output_schema``, False when it never did (retry exhaustion,
    a bad merged or post-block output), None when the run stopped before an answer.
    ``attempts`` counts model calls, ``retries`` recovery retries (attempts - 1).
    ``max_completion_tokens`` is the longest single answer of the run. Tokens and
    attempts are the app's own; ``total_latency_ms`` is end to end (children included),
    ``own_latency_ms`` excludes the time spent in child runs.
    """

    run_key: str = Field(min_length=1)
    workflow_id: str = ""
    app: str
    app_version: str
    model: str
    status: RunStatus
    error_type: str | None = None
    input_valid: bool | None = None
    output_valid: bool | None = None
    attempts: int = Field(default=0, ge=0)
    retries: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    total_tokens: int = Field(default=0, ge=0)
    max_completion_tokens: int = Field(default=0, ge=0)
    llm_latency_ms: float = Field(default=0.0, ge=0)
    total_latency_ms: float = Field(default=0.0, ge=0)
    own_latency_ms: float = Field(default=0.0, ge=0)
    schema_version: int = STATS_SCHEMA_VERSION
    created_at: AwareDatetime


class RllmStats(BaseModel):
    """Aggregate of the runs of one app version on one model.

    Percentages are over the runs where the check happened (``None`` when none did).
    Averages are per run; ``tokens_per_attempt`` is total tokens over model calls;
    ``ms_per_1k_tokens`` is model time per thousand tokens (prompt + completion), over
    runs that made a call.
    """

    app: str
    app_version: str
    model: str
    runs: int
    successes: int
    failures: int
    input_compliance_pct: float | None
    output_compliance_pct: float | None
    avg_latency_ms: float
    avg_own_latency_ms: float
    avg_llm_latency_ms: float
    avg_prompt_tokens: float
    avg_completion_tokens: float
    max_completion_tokens: int
    ms_per_1k_tokens: float | None
    avg_retries: float
    tokens_per_attempt: float | None
    first_run_at: datetime | None = None
    last_run_at: datetime | None = None
    schema_version: int = STATS_SCHEMA_VERSION


def _pct(flags: Sequence[bool | None]) -> float | None:
    seen = [f for f in flags if f is not None]
    if not seen:
        return None
    return round(100.0 * sum(1 for f in seen if f) / len(seen), 2)


def _avg(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 3) if values else 0.0


def aggregate_one(records: Sequence[RllmRunRecord]) -> RllmStats:
    """The stats of records that all share one app, version and model.

    Raises:
        ValueError: no records, or records of different apps, versions or models.
    """
    if not records:
        raise ValueError("no runs to aggregate")
    keys = {(r.app, r.app_version, r.model) for r in records}
    if len(keys) != 1:
        raise ValueError(f"records of several apps/versions/models: {sorted(keys)}")
    app, version, model = keys.pop()
    n = len(records)
    called = [r for r in records if r.attempts > 0]
    tokens = sum(r.total_tokens for r in called)
    llm_ms = sum(r.llm_latency_ms for r in called)
    attempts = sum(r.attempts for r in records)
    return RllmStats(
        app=app,
        app_version=version,
        model=model,
        runs=n,
        successes=sum(1 for r in records if r.status == "ok"),
        failures=sum(1 for r in records if r.status != "ok"),
        input_compliance_pct=_pct([r.input_valid for r in records]),
        output_compliance_pct=_pct([r.output_valid for r in records]),
        avg_latency_ms=_avg([r.total_latency_ms for r in records]),
        avg_own_latency_ms=_avg([r.own_latency_ms for r in records]),
        avg_llm_latency_ms=_avg([r.llm_latency_ms for r in records]),
        avg_prompt_tokens=_avg([float(r.prompt_tokens) for r in records]),
        avg_completion_tokens=_avg([float(r.completion_tokens) for r in records]),
        max_completion_tokens=max(r.max_completion_tokens for r in records),
        ms_per_1k_tokens=round(1000.0 * llm_ms / tokens, 3) if tokens else None,
        avg_retries=_avg([float(r.retries) for r in records]),
        tokens_per_attempt=round(tokens / attempts, 3) if attempts else None,
        first_run_at=min(r.created_at for r in records),
        last_run_at=max(r.created_at for r in records),
    )


def aggregate(records: Iterable[RllmRunRecord]) -> list[RllmStats]:
    """Stats per (app, version, model), sorted by app, then version, then model."""
    groups: dict[tuple[str, str, str], list[RllmRunRecord]] = {}
    for r in records:
        groups.setdefault((r.app, r.app_version, r.model), []).append(r)
    return [aggregate_one(groups[k]) for k in sorted(groups)]


class ExecTimePart(BaseModel):
    """The prediction for one app of a (possibly composed) run."""

    key: str
    app: str
    app_version: str
    model: str
    runs: int
    predicted_ms: float | None
    basis: Literal["latency", "tokens", "none"]


class ExecTimePrediction(BaseModel):
    """Predicted wall time of a run: the sum over the app and every app it uses.

    ``predicted_ms`` is None when any part has no recorded runs (``missing`` lists
    them): a partial sum would look like a prediction and be wrong.
    """

    app: str
    model: str | None
    predicted_ms: float | None
    parts: list[ExecTimePart]
    missing: list[str] = Field(default_factory=list)
    schema_version: int = STATS_SCHEMA_VERSION


def predict_part(stats: RllmStats | None, *, prompt_tokens: int | None = None) -> float | None:
    """Predicted milliseconds of one app run from its stats.

    The app's own time, children excluded (they are predicted as parts of their own).
    Without a prompt estimate this is the average own run time. With one (the rendered
    prompt of the given input, in tokens) the model time is re-estimated from
    ``ms_per_1k_tokens``: (prompt + average completion) tokens, times the average number
    of attempts, plus the run's average own time outside the model.
    """
    if stats is None or stats.runs == 0:
        return None
    if prompt_tokens is None or stats.ms_per_1k_tokens is None:
        return round(stats.avg_own_latency_ms, 3)
    overhead = max(0.0, stats.avg_own_latency_ms - stats.avg_llm_latency_ms)
    per_attempt = (prompt_tokens + stats.avg_completion_tokens) * stats.ms_per_1k_tokens / 1000
    return round(overhead + per_attempt * (1.0 + stats.avg_retries), 3)


def combine_stats(stats: Sequence[RllmStats]) -> RllmStats | None:
    """Stats of several groups (e.g. versions of one app) merged, weighted by runs.

    The identity fields are the first group's. None when ``stats`` is empty.
    """
    if not stats:
        return None
    if len(stats) == 1:
        return stats[0]
    total = sum(s.runs for s in stats)

    def w(attr: str) -> float:
        return round(sum(float(getattr(s, attr)) * s.runs for s in stats) / total, 3)

    mk = [s.ms_per_1k_tokens for s in stats if s.ms_per_1k_tokens is not None]
    return stats[0].model_copy(
        update={
            "runs": total,
            "successes": sum(s.successes for s in stats),
            "failures": sum(s.failures for s in stats),
            "avg_latency_ms": w("avg_latency_ms"),
            "avg_own_latency_ms": w("avg_own_latency_ms"),
            "avg_llm_latency_ms": w("avg_llm_latency_ms"),
            "avg_prompt_tokens": w("avg_prompt_tokens"),
            "avg_completion_tokens": w("avg_completion_tokens"),
            "avg_retries": w("avg_retries"),
            "max_completion_tokens": max(s.max_completion_tokens for s in stats),
            "ms_per_1k_tokens": round(sum(mk) / len(mk), 3) if mk else None,
        }
    )


class PredictionPart(BaseModel):
    """One app run that a prediction sums: the app's key in the run tree and its stats."""

    key: str
    app: str
    app_version: str
    model: str
    stats: RllmStats | None = None


def predict(
    app: str,
    model: str | None,
    parts: Sequence[PredictionPart],
    *,
    prompt_tokens: int | None = None,
) -> ExecTimePrediction:
    """Sum the predictions of an app run and every child run it makes.

    ``parts`` has one entry per app run, the root first (a child used twice appears
    twice). ``prompt_tokens`` applies to the root only: children's prompts depend on
    values not known before the run.
    """
    out: list[ExecTimePart] = []
    missing: list[str] = []
    for i, part in enumerate(parts):
        root_tokens = prompt_tokens if i == 0 else None
        stats = part.stats
        ms = predict_part(stats, prompt_tokens=root_tokens)
        basis: Literal["latency", "tokens", "none"] = "none"
        if ms is None:
            missing.append(part.key)
        elif root_tokens is not None and stats is not None and stats.ms_per_1k_tokens:
            basis = "tokens"
        else:
            basis = "latency"
        out.append(
            ExecTimePart(
                key=part.key,
                app=part.app,
                app_version=part.app_version,
                model=part.model,
                runs=stats.runs if stats else 0,
                predicted_ms=ms,
                basis=basis,
            )
        )
    total = None if missing else round(sum(p.predicted_ms or 0.0 for p in out), 3)
    return ExecTimePrediction(app=app, model=model, predicted_ms=total, parts=out, missing=missing)
