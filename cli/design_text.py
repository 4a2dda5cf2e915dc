"""How ``design`` reads as text: the live event lines, ``design show``'s view and
``design diff``'s Change Summary, for people (JSON mode prints the documents)."""

from __future__ import annotations

import json
import shlex
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


def event_line(e: DesignEvent, project: str, ds: str) -> str:
    """One line for one pipeline event, as ``design run`` prints it."""
    p = e.payload
    node = p.get("node_name") or "-"
    t = e.type
    if t == "coverage-update":
        text = f"coverage {p.get('score', 0):.2f}, " + (
            "covered"
            if p.get("covered")
            else f"not covered (missing {', '.join(p['missing'])})"
            if p.get("missing")
            else "not covered"
        )
    elif t == "questions":
        text = f"questions (round {p.get('round')}): {', '.join(p.get('fields', []))}"
    elif t == "answers":
        text = f"answers from {p.get('by') or '?'}: {', '.join(p.get('fields', []))}"
    elif t == "plan-ready":
        choices = ", ".join(f"{k}={v}" for k, v in p.get("choices", {}).items())
        gaps = f"; gaps: {', '.join(p['gaps'])}" if p.get("gaps") else ""
        text = f"plan round {p.get('round')}: {choices}{gaps}"
        if p.get("revision"):
            text += " (sent back by the critics: " + "; ".join(p["revision"]["reasons"]) + ")"
        refused = (p.get("agent") or {}).get("refused") or []
        if refused:
            text += f"; refused model proposals: {', '.join(r['proposal'] for r in refused)}"
    elif t == "reason-card":
        choice = (p.get("choice") or {}).get("id")
        text = f"reason card ({p.get('agent')}): {choice or 'no choice'}, "
        text += f"confidence {p.get('confidence', 0):.2f}"
    elif t == "cost-update":
        unpriced = len(p.get("unpriced") or [])
        text = f"cost {_usd(p.get('monthly_usd'))}/month"
        text += _delta(p.get("delta_vs_prev_usd"), p.get("delta_vs_prev_pct"))
        text += f", {unpriced} unpriced" if unpriced else ""
    elif t == "policy-update":
        flagged = [f"{r['id']} {r['status']}" for r in p.get("rules", []) if r["status"] != "pass"]
        text = f"policy {p.get('overall')}" + (f" ({', '.join(flagged)})" if flagged else "")
        text += ", gate required" if p.get("gate_required") else ""
    elif t == "gate-waiting":
        text = (
            f"gate {p.get('gate')} waiting for approval: "
            f"{_cmd('design', 'approve', project, ds)} "
            f"(or --reject --comment '...' to plan again)"
        )
    elif t == "approval":
        text = f"gate {p.get('gate')} {p.get('status')} by {p.get('by') or '?'}"
    elif t == "artifacts":
        text = f"codegen: {p.get('files')} files"
    elif t == "validation":
        summary = p.get("summary", {})
        text = "validators: " + ", ".join(f"{k} {v}" for k, v in summary.items())
        failed = [k for k, v in summary.items() if v == "failed"]
        if failed:
            text += f"; FAILED: {', '.join(failed)}"
    elif t == "diff-update":
        text = (
            f"diff against {p.get('previous')}: {p.get('files_added')} files added, "
            f"{p.get('files_removed')} removed, {p.get('files_modified')} modified; "
            f"{len(p.get('state_keys_changed', []))} state keys changed"
        )
    elif t == "run-complete":
        text = f"run complete: {p.get('status')}, version {p.get('version')}"
        if p.get("archive_digest"):
            failing = " (failing validation)" if p.get("status") == "validation_failed" else ""
            text += f"; download{failing} with {_cmd('design', 'download', project, ds)}"
    elif t == "run-error":
        text = f"run error ({p.get('status')}): {p.get('message')}"
    else:
        text = json.dumps(p, default=str)[:200]
    return f"[{node}] {text}"


def _view_text(v: dict[str, Any]) -> str:
    lines = [f"{v['project']}/{v['decision_set']}: {v['status']}, version {v['version']}"]
    if v.get("live"):
        live = v["live"]
        lines.append(f"  running: phase {live['phase']}, node {live.get('node') or '-'}")
    if v["previous"]:
        lines.append(f"  previous: {v['previous']}")
    if v["plan"]:
        round_ = f" (round {v['plan_round']})" if v.get("plan_round") else ""
        lines.append(f"  plan{round_}: " + ", ".join(f"{k}={p}" for k, p in v["plan"].items()))
    if v.get("revised_for"):
        lines.append("  revised by the critics for: " + "; ".join(v["revised_for"]))
    for refused in v.get("refused_proposals") or []:
        lines.append(f"  refused model proposal: {refused}")
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
    if v["validation"]:
        lines.append("  validation: " + ", ".join(f"{k} {s}" for k, s in v["validation"].items()))
    if v.get("failed_validators"):
        lines.append("  VALIDATION FAILED: " + ", ".join(v["failed_validators"]))
    if v["archive_digest"]:
        failing = " (fails validation)" if v.get("failed_validators") else ""
        lines.append(
            f"  archive{failing}: {_cmd('design', 'download', v['project'], v['decision_set'])}"
        )
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
