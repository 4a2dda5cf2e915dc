"""What the ``design`` CLI and the API read of a stored decision set: ``design show``'s
view (with the repair rounds and the model each node used), ``design diff``'s Change
Summary, all from the read model (``store.design``) and the ``agent_runs`` rows the run
wrote. No Temporal here: a stored decision set reads the same with no server up."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from keel.design.steps import EVENT_REPAIR, NODES
from store.design import agent_runs_of, count_rows, list_events, stored_view
from store.design import decision_set as decision_set_row

if TYPE_CHECKING:
    from keel.design.diff import DecisionSetDiff
    from store.artifacts import ArtifactStore
    from store.design import StoredDecisionSet

#: The ``agent_runs`` providers of a node that no model answered: the workflow's rules
#: (and the codegen templates).
RULES_PROVIDERS = frozenset({"workflow", "template"})
#: The pipeline's nodes in their order (plan §21.1), the repair rounds after the validators.
NODE_ORDER = {n: float(i) for i, n in enumerate(NODES)} | {
    "repair": NODES.index("validators") + 0.5
}


class DecisionSetNotFound(LookupError):
    """No such decision set, or not the part of it asked for (no previous set, not finished)."""


def repair_round(payload: dict[str, Any]) -> dict[str, Any]:
    """One ``repair`` event's round: its number, the validators that failed before it,
    the findings it worked on (and how many it fixed), the files it changed and the
    validators after it."""
    outcomes = payload.get("outcomes") or []
    return {
        "round": payload.get("round"),
        "failed": payload.get("failed", []),
        "findings": len(outcomes),
        "fixed": sum(1 for o in outcomes if o.get("fixed_by") != "not_fixed"),
        "files_changed": payload.get("files_changed", []),
        "validation": payload.get("validation", {}),
    }


def repair_rounds(sm: sessionmaker[Session], project: str, ds: str) -> list[dict[str, Any]]:
    """The decision set's repair rounds (its ``repair`` events, issue 38 §5), in order
    (:func:`repair_round`)."""
    return [
        repair_round(e["payload"])
        for e in list_events(sm, project, ds)
        if e["type"] == EVENT_REPAIR
    ]


def node_models(sm: sessionmaker[Session], project: str, ds: str) -> list[dict[str, Any]]:
    """Which provider and model answered each node of the run, from its ``agent_runs``
    rows: one entry per node, each with the distinct ``(provider, model)`` that answered
    it and how many runs each. ``answered_by`` is the model's name, or ``rules`` when no
    model answered (the workflow's rules, the templates, or a model call that fell back
    to the rules). The nodes come in the pipeline's order (:data:`NODE_ORDER`: the rows
    are written together at the end of the run, in no order of their own)."""
    nodes: dict[str, dict[tuple[str, str], int]] = {}
    for agent, provider, model in agent_runs_of(sm, project, ds):
        answers = nodes.setdefault(agent, {})
        answers[(provider, model)] = answers.get((provider, model), 0) + 1
    order = sorted(nodes, key=lambda n: NODE_ORDER.get(n, len(NODE_ORDER)))
    return [
        {
            "node": node,
            "answered_by": [
                {
                    "provider": provider,
                    "model": model,
                    "answered_by": model if model and provider not in RULES_PROVIDERS else "rules",
                    "runs": runs,
                }
                for (provider, model), runs in nodes[node].items()
            ],
        }
        for node in order
    ]


#: How much of one prediction's input and output the view keeps (characters of JSON).
_PREDICTION_CHARS = 2000


def _clipped(value: Any) -> Any:
    """``value``, or its JSON cut to :data:`_PREDICTION_CHARS` when it is longer."""
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= _PREDICTION_CHARS else text[:_PREDICTION_CHARS] + "..."


def smoke_view(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``design show`` shows of the ``smoke`` validator in a validation report (a
    dumped :class:`~keel.design.validation.ValidationReport`): its status and summary,
    the steps, the metrics, one prediction per entry point (input and output), a RAG
    plan's answer and the drift report. None when the report has no smoke result."""
    result = next((r for r in report.get("results") or [] if r.get("name") == "smoke"), None)
    if result is None:
        return None
    smoke = (result.get("details") or {}).get("report") or {}
    drift = smoke.get("drift") or {}
    return {
        "status": result.get("status"),
        "summary": result.get("summary"),
        "seconds": smoke.get("seconds"),
        "failed_step": smoke.get("failed_step"),
        "steps": [
            {k: s.get(k) for k in ("name", "ok", "seconds", "detail")}
            for s in smoke.get("steps") or []
        ],
        "entry_points": smoke.get("entry_points") or [],
        "metrics": smoke.get("metrics") or {},
        "predictions": [
            {
                "entry_point": p.get("entry_point"),
                "route": p.get("route"),
                "input": _clipped(p.get("input")),
                "output": _clipped(p.get("output")),
            }
            for p in smoke.get("predictions") or []
        ],
        "answer": _clipped(smoke["answer"]) if smoke.get("answer") else None,
        "drift": None
        if not drift
        else {
            k: drift.get(k)
            for k in ("version", "rows", "psi", "max_psi", "threshold", "drifted")
            if k in drift
        },
    }


def stored_smoke(
    sm: sessionmaker[Session], artifacts: ArtifactStore, project: str, ds: str
) -> dict[str, Any] | None:
    """The smoke of the decision set's last validation (:func:`smoke_view`), read from the
    validation report the run stored (the ``validation`` event names its digest); None
    when no validation ran or its report is not in ``artifacts``."""
    last = stored_view(sm, project, ds).last.get("validation") or {}
    digest = last.get("report")
    if not isinstance(digest, str):
        return None
    from store.artifacts import ArtifactNotFound

    try:
        report = artifacts.get_json(digest)
    except ArtifactNotFound:
        return None
    return smoke_view(report) if isinstance(report, Mapping) else None


def stored_decision_set(sm: sessionmaker[Session], project: str, ds: str) -> StoredDecisionSet:
    """The read model's one read of a decision set.

    Raises:
        DecisionSetNotFound: the project has no decision set ``ds``.
    """
    stored = stored_view(sm, project, ds)
    if stored.row is None:
        raise DecisionSetNotFound(f"project {project!r} has no decision set {ds!r}")
    return stored


def decision_set_view(
    sm: sessionmaker[Session], project: str, ds: str, artifacts: ArtifactStore | None = None
) -> dict[str, Any]:
    """What ``design show <project> <ds>`` shows of a stored decision set (from the read
    model, ``store.design.stored_view``), with its repair rounds and the model each node
    used; with ``artifacts``, the smoke of its last validation (:func:`stored_smoke`:
    metrics, one prediction per entry point, the drift report).

    Raises:
        DecisionSetNotFound: the project has no decision set ``ds``.
    """
    stored = stored_decision_set(sm, project, ds)
    row = stored.row
    assert row is not None
    ev = stored.last
    cost, policy = stored.cost, ev.get("policy-update")
    failed = stored.failed_validators or []
    archive = stored.archive
    plan = ev.get("plan-ready", {})
    return {
        "project": project,
        "decision_set": ds,
        "previous": row["parent_id"],
        "version": row["version"],
        "status": row["status"],
        "plan": plan.get("choices"),
        "plan_round": plan.get("round"),
        # The critics' auto-revision (its own planner round) and the planner agent's
        # proposals the rules refused, of the last round.
        "revised_for": (plan.get("revision") or {}).get("reasons"),
        "refused_proposals": [
            r["proposal"] + ": " + r["reason"] for r in (plan.get("agent") or {}).get("refused", [])
        ],
        "cost": None
        if cost is None
        else {
            k: cost.get(k)
            for k in ("monthly_usd", "delta_vs_prev_usd", "delta_vs_prev_pct", "unpriced")
        },
        "policy": None
        if policy is None
        else {"overall": policy.get("overall"), "rules": policy.get("rules", [])},
        "validation": stored.validation,
        "failed_validators": failed,
        "repairs": repair_rounds(sm, project, ds),
        "nodes": node_models(sm, project, ds),
        "smoke": None if artifacts is None else stored_smoke(sm, artifacts, project, ds),
        "archive_digest": archive["digest"] if archive else None,
        "archive_validation": None if archive is None else "failed" if failed else "passed",
        "rows": count_rows(sm, project, ds),
        "updated_at": row["updated_at"].isoformat() if row["updated_at"] else None,
    }


def load_diff(
    sm: sessionmaker[Session],
    artifacts: ArtifactStore,
    repos_dir: Path,
    project: str,
    ds: str,
    against: str | None,
) -> DecisionSetDiff:
    """What ``design diff`` shows: ``ds`` against ``against`` (default: its previous set),
    read from the store and the project's repository (``repos_dir``, its trees in
    ``artifacts``), compared by :func:`keel.design.diff.decision_set_diff`.

    Raises:
        DecisionSetNotFound: a set is missing, ``ds`` has no previous set, or its run has
            not finished (no Change Summary stored).
    """
    from keel.design.diff import decision_set_diff, diffable
    from store.design import load_previous, repository_diff

    row = decision_set_row(sm, project, ds)
    if row is None:
        raise DecisionSetNotFound(f"project {project!r} has no decision set {ds!r}")
    parent = against if against is not None else row["parent_id"]
    if parent is None:
        raise DecisionSetNotFound(f"{project}/{ds} has no previous decision set")
    old_row = decision_set_row(sm, project, parent)
    if old_row is None:
        raise DecisionSetNotFound(f"project {project!r} has no decision set {parent!r}")
    # Against its own parent, the Diff Summary the run stored (none: not finished).
    summary = stored_view(sm, project, ds).last.get("diff-update") if against is None else {}
    new, old = load_previous(sm, project, ds), load_previous(sm, project, parent)
    if summary is None or new is None or old is None:
        raise DecisionSetNotFound(f"{project}/{ds} has no Change Summary (not finished)")
    # The files from the project's git history: this set's commit against the other's.
    repo = repository_diff(sm, artifacts, repos_dir, project, ds, against=parent)
    old_tf = new_tf = None
    if repo is not None and repo.old is not None:
        old_tf, new_tf = repo.old.texts(".tf"), repo.new.texts(".tf")
    return decision_set_diff(
        project=project,
        decision_set=ds,
        previous=parent,
        old_state=diffable(old_row.get("constraints_json"), old_row.get("plan_json")),
        new_state=diffable(row.get("constraints_json"), row.get("plan_json")),
        files=repo.changes() if repo is not None else {},
        old_tf=old_tf,
        new_tf=new_tf,
        old_cost=old.cost.model_dump(mode="json") if old.cost else None,
        new_cost=new.cost.model_dump(mode="json") if new.cost else None,
        recorded=summary,
    )
