"""How ``design`` reads as text: the live event lines, ``design show``'s view and
``design diff``'s Change Summary, for people (JSON mode prints the documents)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.design.steps import DesignEvent


def _cmd(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _usd(value: Any) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _delta(usd: Any, pct: Any) -> str:
    if usd is None:
        return ""
    text = f"{'+' if usd >= 0 else '-'}${abs(usd):,.2f}"
    if pct is not None:
        text += f", {pct:+.1f}%"
    return f" ({text} against the previous set)"


def _coverage(p: dict[str, Any], project: str, ds: str) -> str:
    return f"coverage {p.get('score', 0):.2f}, " + (
        "covered"
        if p.get("covered")
        else f"not covered (missing {', '.join(p['missing'])})"
        if p.get("missing")
        else "not covered"
    )


def _plan(p: dict[str, Any], project: str, ds: str) -> str:
    choices = ", ".join(f"{k}={v}" for k, v in p.get("choices", {}).items())
    gaps = f"; gaps: {', '.join(p['gaps'])}" if p.get("gaps") else ""
    text = f"plan round {p.get('round')}: {choices}{gaps}"
    if p.get("revision"):
        text += " (sent back by the critics: " + "; ".join(p["revision"]["reasons"]) + ")"
    refused = (p.get("agent") or {}).get("refused") or []
    if refused:
        text += f"; refused model proposals: {', '.join(r['proposal'] for r in refused)}"
    return text


def _reason_card(p: dict[str, Any], project: str, ds: str) -> str:
    choice = (p.get("choice") or {}).get("id")
    text = f"reason card ({p.get('agent')}): {choice or 'no choice'}, "
    return text + f"confidence {p.get('confidence', 0):.2f}"


def _cost(p: dict[str, Any], project: str, ds: str) -> str:
    unpriced = len(p.get("unpriced") or [])
    text = f"cost {_usd(p.get('monthly_usd'))}/month"
    text += _delta(p.get("delta_vs_prev_usd"), p.get("delta_vs_prev_pct"))
    return text + (f", {unpriced} unpriced" if unpriced else "")


def _policy(p: dict[str, Any], project: str, ds: str) -> str:
    flagged = [f"{r['id']} {r['status']}" for r in p.get("rules", []) if r["status"] != "pass"]
    text = f"policy {p.get('overall')}" + (f" ({', '.join(flagged)})" if flagged else "")
    return text + (", gate required" if p.get("gate_required") else "")


def _gate_waiting(p: dict[str, Any], project: str, ds: str) -> str:
    return (
        f"gate {p.get('gate')} waiting for approval: "
        f"{_cmd('design', 'approve', project, ds)} "
        f"(or --reject --comment '...' to plan again)"
    )


def _validation(p: dict[str, Any], project: str, ds: str) -> str:
    summary = p.get("summary", {})
    text = "validators: " + ", ".join(f"{k} {v}" for k, v in summary.items())
    failed = [k for k, v in summary.items() if v == "failed"]
    return text + (f"; FAILED: {', '.join(failed)}" if failed else "")


def _repair(p: dict[str, Any], project: str, ds: str) -> str:
    from client.design_view import repair_round

    return _repair_text(repair_round(p))


def _diff_update(p: dict[str, Any], project: str, ds: str) -> str:
    return (
        f"diff against {p.get('previous')}: {p.get('files_added')} files added, "
        f"{p.get('files_removed')} removed, {p.get('files_modified')} modified; "
        f"{len(p.get('state_keys_changed', []))} state keys changed"
    )


def _run_complete(p: dict[str, Any], project: str, ds: str) -> str:
    text = f"run complete: {p.get('status')}, version {p.get('version')}"
    if p.get("archive_digest"):
        failing = " (failing validation)" if p.get("status") == "validation_failed" else ""
        text += f"; download{failing} with {_cmd('design', 'download', project, ds)}"
    return text


#: ``event type -> its line's text of (payload, project, decision set)``.
_EVENT_TEXT: dict[str, Callable[[dict[str, Any], str, str], str]] = {
    "coverage-update": _coverage,
    "questions": lambda p, *_: (
        f"questions (round {p.get('round')}): {', '.join(p.get('fields', []))}"
    ),
    "answers": lambda p, *_: f"answers from {p.get('by') or '?'}: {', '.join(p.get('fields', []))}",
    "plan-ready": _plan,
    "reason-card": _reason_card,
    "cost-update": _cost,
    "policy-update": _policy,
    "gate-waiting": _gate_waiting,
    "approval": lambda p, *_: f"gate {p.get('gate')} {p.get('status')} by {p.get('by') or '?'}",
    "artifacts": lambda p, *_: f"codegen: {p.get('files')} files",
    "validation": _validation,
    "repair": _repair,
    "diff-update": _diff_update,
    "run-complete": _run_complete,
    "run-error": lambda p, *_: f"run error ({p.get('status')}): {p.get('message')}",
}


def event_line(e: DesignEvent, project: str, ds: str) -> str:
    """One line for one pipeline event, as ``design run`` prints it."""
    p = e.payload
    node = p.get("node_name") or "-"
    text_of = _EVENT_TEXT.get(e.type)
    text = text_of(p, project, ds) if text_of else json.dumps(p, default=str)[:200]
    return f"[{node}] {text}"


def run_end(project: str, ds: str, last: DesignEvent | None) -> tuple[dict[str, Any], str]:
    """``design run``'s document and text of how the run ended: ``last`` its last event
    (None: started detached, still running); the document's ``status`` the outcome."""
    if last is None:
        return (
            {"project": project, "decision_set": ds, "status": "running"},
            f"{project}/{ds}: started; follow it with `design show {project} {ds}`",
        )
    p = last.payload
    if last.type == "run-error":
        return (
            {"project": project, "decision_set": ds, "status": "failed", "error": p},
            f"{project}/{ds}: failed: {p.get('message')}",
        )
    status = p.get("status", "completed")
    doc = {
        "project": project,
        "decision_set": ds,
        "status": status,
        "version": p.get("version"),
        "archive_digest": p.get("archive_digest"),
    }
    text = f"{project}/{ds}: {status}, version {p.get('version')}"
    if p.get("archive_digest"):
        failing = " (archive fails validation)" if status == "validation_failed" else ""
        text += f"; {_cmd('design', 'download', project, ds)}{failing}"
    return doc, text


def _repair_text(r: dict[str, Any]) -> str:
    """One repair round (``client.design_view.repair_rounds``) in a line."""
    files = r["files_changed"]
    after = r["validation"]
    failing = [k for k, v in after.items() if v == "failed"]
    text = (
        f"repair round {r['round']}: {r['findings']} findings "
        f"({', '.join(r['failed'])} failed), {r['fixed']} fixed; "
        f"{len(files)} file{'' if len(files) == 1 else 's'} changed"
        + (f" ({', '.join(files)})" if files else "")
    )
    if after:
        text += "; then " + (f"FAILED: {', '.join(failing)}" if failing else "all passed")
    return text


def _node_text(n: dict[str, Any]) -> str:
    """Which provider and model answered one node (``client.design_view.node_models``)."""
    answers = []
    for a in n["answered_by"]:
        who = "rules" if a["answered_by"] == "rules" else f"{a['model']} ({a['provider']})"
        answers.append(who + (f" x{a['runs']}" if a["runs"] > 1 else ""))
    return f"    {n['node']}: {', '.join(answers)}"


def _plan_lines(v: dict[str, Any]) -> list[str]:
    lines = []
    if v["plan"]:
        round_ = f" (round {v['plan_round']})" if v.get("plan_round") else ""
        lines.append(f"  plan{round_}: " + ", ".join(f"{k}={p}" for k, p in v["plan"].items()))
    if v.get("revised_for"):
        lines.append("  revised by the critics for: " + "; ".join(v["revised_for"]))
    lines += [f"  refused model proposal: {r}" for r in v.get("refused_proposals") or []]
    if v["cost"]:
        c = v["cost"]
        unpriced = f", {len(c['unpriced'])} unpriced" if c.get("unpriced") else ""
        lines.append(
            f"  cost: {_usd(c['monthly_usd'])}/month"
            f"{_delta(c['delta_vs_prev_usd'], c['delta_vs_prev_pct'])}{unpriced}"
        )
    if v["policy"]:
        p = v["policy"]
        flagged = [f"{r['id']} {r['status']}" for r in p["rules"] if r["status"] != "pass"]
        lines.append(f"  policy: {p['overall']}" + (f" ({', '.join(flagged)})" if flagged else ""))
    return lines


def _smoke_lines(smoke: dict[str, Any]) -> list[str]:
    """``design show``'s smoke: its verdict, the metrics, one prediction per entry point
    and the drift report (``client.design_view.smoke_view``)."""
    lines = [f"  smoke: {smoke['status']}: {smoke['summary']}"]
    if smoke.get("metrics"):
        shown = ", ".join(f"{k} {v}" for k, v in sorted(smoke["metrics"].items()))
        lines.append(f"    metrics: {shown}")
    for p in smoke.get("predictions") or []:
        given = json.dumps(p["input"], sort_keys=True, default=str)
        answer = json.dumps(p["output"], sort_keys=True, default=str)
        lines.append(f"    {p['entry_point']} {p['route']}: {_cut(given)} -> {_cut(answer)}")
    answered = smoke.get("answer")
    if isinstance(answered, dict):
        cited = ", ".join(str(p.get("doc_id")) for p in answered.get("passages") or [])
        lines.append(
            f"    answer ({answered.get('model')}, passages {cited}): "
            f"{_cut(str(answered.get('answer')))}"
        )
    drift = smoke.get("drift")
    if drift:
        drifted = ", ".join(drift.get("drifted") or []) or "none"
        lines.append(
            f"    drift: {drift.get('rows')} served rows, max PSI {drift.get('max_psi')} "
            f"(threshold {drift.get('threshold')}), drifted: {drifted}"
        )
    for step in smoke.get("steps") or []:
        if not step.get("ok"):
            lines.append(f"    FAILED step {step['name']}: {_cut(str(step.get('detail')))}")
    return lines


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _view_text(v: dict[str, Any]) -> str:
    """``design show <project> <ds>``'s text (``client.design_view.decision_set_view``)."""
    lines = [f"{v['project']}/{v['decision_set']}: {v['status']}, version {v['version']}"]
    if v.get("live"):
        live = v["live"]
        lines.append(f"  running: phase {live['phase']}, node {live.get('node') or '-'}")
    if v["previous"]:
        lines.append(f"  previous: {v['previous']}")
    lines += _plan_lines(v)
    if v["validation"]:
        lines.append("  validation: " + ", ".join(f"{k} {s}" for k, s in v["validation"].items()))
    if v.get("smoke"):
        lines += _smoke_lines(v["smoke"])
    lines += [f"  {_repair_text(r)}" for r in v.get("repairs") or []]
    if v.get("failed_validators"):
        lines.append("  VALIDATION FAILED: " + ", ".join(v["failed_validators"]))
    if v["archive_digest"]:
        failing = " (fails validation)" if v.get("failed_validators") else ""
        lines.append(
            f"  archive{failing}: {_cmd('design', 'download', v['project'], v['decision_set'])}"
        )
    if v.get("nodes"):
        lines.append("  nodes (who answered):")
        lines += [_node_text(n) for n in v["nodes"]]
    return "\n".join(lines)


def _cost_line_text(c: Any) -> str:
    where = f"{c.capability} {c.resource}" + (f" [{c.region}]" if c.region else "")

    def side(qty: float | None, usd: float | None) -> str:
        if usd is None:
            return "none"
        return (f"{qty:,.6g} {c.unit} " if qty is not None else "") + f"{_usd(usd)}/month"

    return f"{where}: {side(c.old_quantity, c.old_usd)} -> {side(c.new_quantity, c.new_usd)}"


def _diff_text(d: Any) -> str:
    """``design diff``'s text: a :class:`keel.design.diff.DecisionSetDiff` for people."""
    lines = [f"{d.project}/{d.decision_set} against {d.previous}:"]
    for label, paths in (
        ("added", d.files_added),
        ("removed", d.files_removed),
        ("modified", d.files_modified),
    ):
        lines.append(f"  files {label} ({len(paths)})" + "".join(f"\n    {p}" for p in paths))
    lines.append(f"  state keys changed: {', '.join(d.state_keys_changed) or 'none'}")
    lines += [f"    + {path}" for path in d.changes.added]
    lines += [f"    - {path}" for path in d.changes.removed]
    for c in d.changes.changed:
        lines.append(f"    ~ {c.path}: {json.dumps(c.old)} -> {json.dumps(c.new)}")
    tf = d.terraform
    if tf is None:
        lines.append("  terraform: no repository to compare (not generated)")
    else:
        for label, mark, items in (
            ("added", "+", tf.added),
            ("removed", "-", tf.removed),
            ("changed", "~", tf.changed),
        ):
            lines.append(f"  terraform resources {label} ({len(items)})")
            lines += [
                f"    {mark} {r.address}" + (f" [{r.region}]" if r.region else "") for r in items
            ]
        if tf.unreadable:
            lines.append("  terraform files not HCL, not compared: " + ", ".join(tf.unreadable))
    lines.append(f"  cost lines changed ({len(d.cost_lines)})")
    lines += [f"    ~ {_cost_line_text(c)}" for c in d.cost_lines]
    delta = _delta(d.cost_delta_usd, d.cost_delta_pct)
    lines.append(f"  cost: {_usd(d.monthly_usd)}/month{delta}")
    return "\n".join(lines)


def refusal(r: Exception, what: str = "") -> tuple[str, str, str | None]:
    """A use case's refusal (``client.design_refusals``) in the CLI's words: its error
    code, message and hint; ``what`` the command wanted of a run that is not running."""
    from client import design_refusals as why

    hint = None
    match r:
        case why.ProjectNotFound():
            code, message = "not_found", f"no project {r.project!r}"
            hint = f"create it with `design new {r.project}`"
        case why.NotProjectOwner():
            code, message = "conflict", f"project {r.project!r} belongs to {r.owner}, not {r.actor}"
        case why.InvalidProjectId():
            code = "usage"
            message = f"a project id is letters, digits, '.', '_' and '-', not {r.project!r}"
        case why.PreviousNotStored():
            code, message = "not_found", f"project {r.project!r} has no decision set {r.previous!r}"
        case why.NoRun():
            code, message = "not_found", f"no decision set {r.project}/{r.decision_set} has run"
        case why.NotRunning():
            code = "not_found"
            message = f"{r.project}/{r.decision_set} has {what}: the run is {r.status}"
        case why.NoOpenGate():
            code = "not_found"
            message = f"{r.project}/{r.decision_set} has no open gate (phase {r.status.phase})"
        case why.GateNotOpenYet():
            code, message = "not_found", f"gate {r.gate_id} is not open yet: try again shortly"
        case why.NoWorker():
            code = "error"
            message = f"no worker answered for {r.project}/{r.decision_set}: {r.error}"
        case why.InvalidAnswer() | why.NoOpenQuestions():
            code, message = "refused", r.message
        case why.NoArchive():
            code = "not_found"
            message = (
                f"{r.project}/{r.decision_set} has no repository (not finished, or run with "
                "--no-generate)"
            )
        case _:
            code, message = _repository_refusal(r)
    return code, message, hint


def _repository_refusal(r: Exception) -> tuple[str, str]:
    """The refusals of the use cases on a set's repository and codegen, the API's so far."""
    from client import design_refusals as why

    match r:
        case why.NoSuchArchive():
            return "not_found", f"no archive {r.digest}"
        case why.NoRepository():
            return "not_found", f"{r.decision_set} has no repository"
        case why.NoSuchFile():
            where = " or its previous set" if r.or_before else ""
            return "not_found", f"no file {r.path!r} in {r.decision_set}{where}"
        case why.FileTooLarge():
            return "invalid_input", f"{r.path!r} is {r.size} bytes; download the archive"
        case why.NotText():
            return "invalid_input", f"{r.path!r} is not UTF-8 text"
        case why.NotCompleted():
            return "conflict", f"{r.decision_set} is {r.status}, not completed"
        case why.HasRepository():
            return "conflict", f"{r.decision_set} has its repository already"
        case why.WebhookNotAllowed():
            return "invalid_input", (
                f"webhook URL {r.url!r} is not KEEL_WEBHOOK_URL nor under "
                "KEEL_WEBHOOK_ALLOWED_PREFIXES"
            )
    return "error", str(r) or type(r).__name__
