"""How ``mrp`` reads as text: the progress line, a run's result, ``mrp compile``'s and
``mrp replay``'s summaries and ``mrp inspect``'s view, for people, and the JSON documents
JSON mode prints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.mrp.run import MRPJobResult, RunManifest


def _short(digest: str | None, n: int = 16) -> str:
    return "-" if not digest else digest.removeprefix("blake3:")[:n]


def _progress_line(view: Any, progress: dict[str, Any] | None) -> str:
    """``[map] shards 40/100, windows 1/2, cost 40 units, $0``."""
    if view is None:
        return "[compile] compiling"
    if view.status != "running":
        return f"[{view.status}]"
    phase = str((progress or {}).get("phase") or ("compile" if not view.shards_total else "map"))
    line = f"[{phase}] shards {view.shards_done}/{view.shards_total}"
    if progress and progress.get("windows_total"):
        line += f", windows {progress['windows_done']}/{progress['windows_total']}"
    return line + f", cost {view.cost.units} units, ${view.cost.usd}"


_PHASES = ["compile", "map", "reduce", "evaluate", "approval", "produce", "finalise"]


def _timings(timings: dict[str, float]) -> str:
    """``compile 0.24s, map 0.14s, ...`` in phase order."""
    order = {p: i for i, p in enumerate(_PHASES)}
    keys = sorted(timings, key=lambda k: (order.get(k, len(order)), k))
    return ", ".join(f"{k} {timings[k]:.2f}s" for k in keys)


def _result_doc(result: MRPJobResult) -> dict[str, Any]:
    return result.model_dump(mode="json")


def _result_text(result: MRPJobResult) -> str:
    c = result.counters
    cost = result.cost
    lines = [
        f"{result.job_id}: {result.status} (run {result.run_id}, backend {result.backend})",
        f"  shards     {c.total} total: {c.run} run, {c.skipped} from checkpoints, "
        f"{c.retried} retried, {c.failed} failed, {c.cancelled} cancelled",
        f"  cost       {cost.units} units (limit {cost.limit_units}), ${cost.usd} "
        f"(limit ${cost.limit_usd}); {cost.llm_calls} LLM calls, {cost.llm_cached} cached",
    ]
    if result.phase_timings:
        lines.append(f"  phases     {_timings(result.phase_timings)}")
    if result.evaluation is not None:
        ev = result.evaluation
        lines.append(
            f"  evaluation score {ev.score} (min {ev.min_score}): {'passed' if ev.passed else 'failed'}"
        )
    lines.append(f"  manifest   {result.manifest_digest}")
    lines.append(f"  run manifest {result.run_manifest_digest}")
    for key, digest in result.output_digests.items():
        lines.append(
            f"  {key:<10} {digest}" if len(key) <= 10 else f"  {key}\n             {digest}"
        )
    if result.output_root:
        lines.append(f"  output     {result.output_root}")
    if result.message:
        lines.append(f"  note       {result.message}")
    return "\n".join(lines)


def _inspect_text(
    record: Any,
    manifest: Any,
    run_manifest: RunManifest | None,
    rows: list[Any],
    by_state: dict[str, int],
    limit: int,
    downloaded: list[dict[str, Any]] | None,
) -> str:
    """``mrp inspect``'s view: the run, its compile manifest, phases, cost, shards, run
    manifest and what ``--download`` copied."""
    lines = _record_lines(record)
    if manifest is not None:
        lines += _manifest_lines(record, manifest)
    timings = (run_manifest.phase_timings if run_manifest else None) or record.phase_timings
    if timings:
        lines.append(f"phases       {_timings(timings)}")
    lines += _cost_lines(record.cost)
    lines += _shard_lines(record, rows, by_state, limit)
    if run_manifest is not None:
        lines += _run_manifest_lines(record, run_manifest, limit)
    if downloaded is not None:
        lines.append(f"downloaded   {len(downloaded)} files")
        for d in downloaded:
            lines.append(f"  {d['path']}")
    return "\n".join(lines)


def _record_lines(record: Any) -> list[str]:
    lines = [
        f"{record.job_id} run {record.run_id}: {record.status} (backend {record.backend}"
        + (f", replay of {record.replay_of}" if record.replay_of else "")
        + ")",
        f"  workflow     {record.workflow_id}",
        f"  created      {record.created_at:%Y-%m-%d %H:%M:%S %Z}, updated "
        f"{record.updated_at:%Y-%m-%d %H:%M:%S %Z}",
    ]
    if record.error:
        lines.append(f"  error        {record.error}")
    return lines


def _manifest_lines(record: Any, manifest: Any) -> list[str]:
    lines = [
        "manifest",
        f"  digest       {record.manifest_digest}",
        f"  IR           {manifest.ir_digest}",
        f"  job          {manifest.job_digest} (DSL {manifest.dsl_version})",
        f"  inputs       {manifest.inputs_digest}, {len(manifest.input_digests)} shards",
    ]
    for op in manifest.operators:
        lines.append(
            f"  {op.role:<12} {op.ref} ({op.kind}, code {_short(op.code_digest, 12)}, "
            f"{'signed' if op.signed else 'unsigned'})"
        )
    lines.append(f"  seeds        job {manifest.seeds.job}")
    return lines


def _cost_lines(cost: Any) -> list[str]:
    return [
        f"cost         {cost.units} units (estimate {cost.estimate_units}, kill limit "
        f"{cost.limit_units}), ${cost.usd} (limit ${cost.limit_usd})"
        + (f", tripped on {cost.tripped}" if cost.tripped else ""),
        f"             {cost.llm_calls} LLM calls, {cost.llm_cached} from the cache",
    ]


def _shard_lines(record: Any, rows: list[Any], by_state: dict[str, int], limit: int) -> list[str]:
    states = ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) or "none recorded yet"
    c = record.counters
    lines = [
        f"shards       {record.shard_count} total: {states}; counters run {c.run}, "
        f"skipped {c.skipped}, retried {c.retried}, failed {c.failed}"
    ]
    for r in rows[:limit]:
        out = _short(r.output_digest) if r.output_digest else (r.error or "-")[:60]
        lines.append(
            f"  {r.shard_id} {r.state:<9} {r.source:<10} attempts {r.attempts} "
            f"{r.latency_ms:7.0f} ms  {out}"
        )
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more (--shards N, or --json)")
    failed = [r for r in rows if r.state == "failed"]
    if failed:
        # Every failed shard and why, whatever --shards says: a run that went on without
        # them (map.min_success_ratio) names each one here.
        lines.append(f"failed shards {len(failed)}")
        for r in failed:
            lines.append(f"  {r.shard_id} after {r.attempts} attempts: {r.error or '-'}")
    return lines


def _run_manifest_lines(record: Any, run_manifest: RunManifest, limit: int) -> list[str]:
    lines = [f"run manifest {record.run_manifest_digest}"]
    if run_manifest.reduce_digest:
        lines.append(f"  reduce       {run_manifest.reduce_digest}")
    if run_manifest.skipped_record_count:
        lines.append(
            f"  skipped      {run_manifest.skipped_record_count} malformed input records "
            "(inputs.on_malformed: skip)"
        )
        for m in run_manifest.skipped_records[:limit]:
            lines.append(f"    {m.describe()}")
        if run_manifest.skipped_record_count > min(limit, len(run_manifest.skipped_records)):
            lines.append(f"    ... all in {run_manifest.skipped_records_digest} (--json)")
    if run_manifest.evaluation is not None:
        ev = run_manifest.evaluation
        lines.append(
            f"  evaluation   score {ev.score} (min {ev.min_score}), {'passed' if ev.passed else 'failed'}"
        )
    if run_manifest.produced:
        lines.append(f"outputs      {run_manifest.output_root}")
        for f in run_manifest.produced:
            lines.append(
                f"  {f.path:<28} {f.size:>8} bytes  {f.digest}"
                + (f"\n  {'':<28} -> {f.uri}" if f.uri else "")
            )
    return lines


def shard_states(rows: list[Any]) -> dict[str, int]:
    """Shards by state (a shard taken from a checkpoint counts as ``skipped``)."""
    by_state: dict[str, int] = {}
    for r in rows:
        key = r.state if r.source != "checkpoint" else "skipped"
        by_state[key] = by_state.get(key, 0) + 1
    return by_state


def inspect_doc(
    record: Any,
    manifest: Any,
    run_manifest: RunManifest | None,
    rows: list[Any],
    downloaded: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """``mrp inspect``'s JSON document."""
    doc: dict[str, Any] = {
        "run": record.model_dump(mode="json"),
        "manifest": manifest.model_dump(mode="json") if manifest else None,
        "run_manifest": run_manifest.model_dump(mode="json") if run_manifest else None,
        "shards": [r.model_dump(mode="json") for r in rows],
        "shard_states": shard_states(rows),
        "failed_shards": [
            {"shard_id": r.shard_id, "attempts": r.attempts, "error": r.error}
            for r in rows
            if r.state == "failed"
        ],
    }
    if downloaded is not None:
        doc["downloaded"] = downloaded
    return doc


# -- compile and replay --------------------------------------------------------------------


def compile_doc(result: Any, out_dir: Path, files: list[str]) -> dict[str, Any]:
    """``mrp compile``'s document: the job, what was written, digests and rule counts."""
    ir = result.ir
    est = ir.budget.estimate
    rules = result.policy_report.rules_evaluated
    return {
        "job_id": ir.job_id,
        "out_dir": str(out_dir),
        "files": sorted(files),
        "shards": len(ir.map_tasks),
        "operators": {role: b.ref for role, b in sorted(ir.operators.items())},
        "estimate": {"units": str(est.units), "usd": str(est.usd)},
        "ir_digest": ir.digest(),
        "manifest_digest": result.manifest.digest(),
        "policy_report_digest": result.policy_report.digest(),
        "rules": {
            "passed": sum(r.status == "passed" for r in rules),
            "skipped": sum(r.status == "skipped" for r in rules),
        },
    }


def compile_text(doc: dict[str, Any]) -> str:
    ops = ", ".join(f"{role} {ref}" for role, ref in doc["operators"].items())
    est = doc["estimate"]
    return "\n".join(
        [
            f"{doc['job_id']}: compiled, {doc['shards']} shards; admitted "
            f"({doc['rules']['passed']} rules passed, {doc['rules']['skipped']} skipped)",
            f"  operators  {ops}",
            f"  estimate   {est['units']} units, ${est['usd']}",
            f"  IR         {doc['ir_digest']}",
            f"  manifest   {doc['manifest_digest']}",
            f"  written    {doc['out_dir']}/{{IR.json, manifest.json, policy_report.json}}",
        ]
    )


def replay_doc(run_id: str, new_id: str, wid: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``mrp replay``'s document: the comparison and its first difference."""
    differing = [r for r in rows if not r["same"]]
    return {
        "run_id": run_id,
        "replay_run_id": new_id,
        "workflow_id": wid,
        "compared": len(rows),
        "matched": len(rows) - len(differing),
        "first_difference": differing[0]["what"] if differing else None,
        "digests": rows,
    }


def replay_text(doc: dict[str, Any], all_rows: bool) -> str:
    """The count of equal digests, then the differing ones (every one with ``--all``; the
    reduce and file digests when all are equal)."""
    rows = doc["digests"]
    differing = [r for r in rows if not r["same"]]
    lines = [
        f"replay of {doc['run_id']} as {doc['replay_run_id']}: "
        f"{len(rows) - len(differing)}/{len(rows)} digests equal"
    ]
    for r in rows if all_rows else differing:
        mark = "same" if r["same"] else "DIFFERENT"
        lines.append(
            f"  {r['what']:<40} {mark:<9} original {_short(r['original'])}  "
            f"replay {_short(r['replay'])}"
        )
    if not all_rows and not differing:
        for r in rows:
            if r["what"] == "reduce" or r["what"].startswith("produced:"):
                lines.append(f"  {r['what']:<40} same      {r['original']}")
    return "\n".join(lines)
