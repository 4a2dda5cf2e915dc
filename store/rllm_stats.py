"""``.rllm`` run statistics in the SQL store: write one row per run, aggregate on read.

Rows are :class:`keel.rllm.stats.RllmRunRecord` (table ``rllm_runs``); the maths is in
:mod:`keel.rllm.stats`. Writes are idempotent by ``run_key`` because the writer is a
Temporal activity that may run twice.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keel.llm import ModelsConfig
from keel.rllm.deps import ResolvedApp
from keel.rllm.model import RllmProgram
from keel.rllm.run import resolve_model_name
from keel.rllm.stats import (
    ExecTimePrediction,
    PredictionPart,
    RllmRunRecord,
    RllmStats,
    aggregate,
    combine_stats,
    predict,
)
from store.models import RllmRunRow
from store.records import _insert_row

log = logging.getLogger(__name__)


def record_run(sessions: sessionmaker[Session], record: RllmRunRecord) -> bool:
    """Store one finished run. False (nothing written) when ``run_key`` is already stored."""
    inserted = _insert_row(sessions, RllmRunRow, record.model_dump(), ["run_key"])
    if not inserted:
        log.debug("rllm run %s already recorded", record.run_key)
    return inserted


def list_runs(
    sessions: sessionmaker[Session],
    app: str,
    *,
    model: str | None = None,
    app_version: str | None = None,
) -> list[RllmRunRecord]:
    """The stored runs of ``app`` (optionally of one model / version), oldest first."""
    stmt = select(RllmRunRow).where(RllmRunRow.app == app)
    if model is not None:
        stmt = stmt.where(RllmRunRow.model == model)
    if app_version is not None:
        stmt = stmt.where(RllmRunRow.app_version == app_version)
    stmt = stmt.order_by(RllmRunRow.created_at, RllmRunRow.id)
    with sessions() as session:
        return [
            RllmRunRecord.model_validate(r, from_attributes=True) for r in session.scalars(stmt)
        ]


def get_stats(
    sessions: sessionmaker[Session],
    app: str,
    model: str | None = None,
    *,
    app_version: str | None = None,
) -> list[RllmStats]:
    """Stats of ``app`` per (version, model), sorted; only ``model``'s when given.

    An app with no recorded runs gives an empty list.
    """
    return aggregate(list_runs(sessions, app, model=model, app_version=app_version))


def _stats_for(
    sessions: sessionmaker[Session], program: RllmProgram, model: str
) -> tuple[str, RllmStats | None]:
    """Stats of the program's own version on ``model``; else of all its versions."""
    exact = get_stats(sessions, program.name, model, app_version=program.version)
    if exact:
        return program.version, exact[0]
    every = get_stats(sessions, program.name, model)
    return ("*" if every else program.version), combine_stats(every)


def run_parts(
    resolved: ResolvedApp, models: ModelsConfig, model: str | None = None
) -> list[tuple[str, RllmProgram, str]]:
    """Every app run a run of ``resolved`` makes: (tree key, program, model name).

    The root first, then each ``uses`` entry depth first in file order; a child used
    twice appears twice. Keys are ``root`` and ``root/alias/alias...``.

    Raises:
        MetadataValidationError: an app's model is not in ``models``.
    """
    out: list[tuple[str, RllmProgram, str]] = []

    def walk(key: str, graph_key: str) -> None:
        program = resolved.programs[graph_key]
        out.append((key, program, resolve_model_name(program.llm, model, models)))
        for edge in resolved.graph.children(graph_key):
            walk(f"{key}/{edge.alias}", edge.child)

    walk(resolved.graph.root, resolved.graph.root)
    return out


def predict_exectime(
    sessions: sessionmaker[Session],
    resolved: ResolvedApp,
    models: ModelsConfig,
    *,
    model: str | None = None,
    prompt_tokens: int | None = None,
) -> ExecTimePrediction:
    """Predict a run's wall time from the stored stats, summing over the apps it uses.

    ``model`` overrides every app's model, as ``RllmRunInput.model`` does.
    ``prompt_tokens`` (the estimate of the root's rendered prompt for a given input,
    :func:`keel.rllm.estimate.estimate_prompt_tokens`) re-scales the root's model time
    by ``ms_per_1k_tokens``. A part whose app version has no runs falls back to the runs
    of all its versions (its ``app_version`` is then ``*``); a part with no runs at all
    makes ``predicted_ms`` None and is listed in ``missing``.
    """
    parts: list[PredictionPart] = []
    for key, program, model_name in run_parts(resolved, models, model):
        version, stats = _stats_for(sessions, program, model_name)
        parts.append(
            PredictionPart(
                key=key, app=program.name, app_version=version, model=model_name, stats=stats
            )
        )
    return predict(resolved.root.name, model, parts, prompt_tokens=prompt_tokens)
