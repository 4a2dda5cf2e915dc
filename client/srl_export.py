"""``srl export``'s files: ``steps.jsonl`` (one §7 record a line) and ``steps.parquet``
(the row's columns, the record's parts, TRL's conversational columns; docs/srl-export.md).
pyarrow is imported only when a file is written."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.srl.steps import SrlTask
    from keel.srl.trajectory import StepRow


def _record_columns(record_json: str) -> dict[str, Any]:
    """The record's parts a trainer reads, as flat values (JSON text for the open ones).
    The chat, the completion and the think text are :func:`keel.srl.export.trainer_columns`'."""
    import json

    record = json.loads(record_json)
    out = record.get("model_output") or {}
    sampling = record.get("sampling") or {}
    reward = record.get("reward") or {}

    def text(value: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)

    return {
        "action": text(out.get("action")),
        "state_update": text(out.get("state_update")),
        "raw": out.get("raw", ""),
        "format_error": out.get("format_error"),
        "state_before": text(record.get("state_before")),
        "state_after": text(record.get("state_after")),
        "temperature": sampling.get("temperature"),
        "top_p": sampling.get("top_p"),
        "max_tokens": sampling.get("max_tokens"),
        "prompt_tokens": out.get("prompt_tokens"),
        "completion_tokens": out.get("completion_tokens"),
        "finish_reason": out.get("finish_reason"),
        "latency_s": out.get("latency_s"),
        "cost_usd": out.get("cost_usd"),
        "endpoint": out.get("endpoint"),
        # Both rewards, and what they are computed from (docs/srl.md, "Rewards"): Keel's
        # is reward_total (and `reward`) and step_similarity among the row's columns.
        "paper_reward": reward.get("paper_reward"),
        "reward_version": reward.get("reward_version"),
        "effect": reward.get("effect"),
        "expert_action": text(record.get("expert_action")),
        "expert_text_after": record.get("expert_text_after"),
        "text_before": record.get("text_before"),
        "text_after": record.get("text_after"),
    }


def export_schema() -> Any:
    """The Parquet schema of ``steps.parquet``: every column typed (a column of nulls
    keeps its type; TRL's chat columns are lists of ``{role, content}``)."""
    import pyarrow as pa

    chat = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    s, i, f, b = pa.string(), pa.int64(), pa.float64(), pa.bool_()
    return pa.schema(
        [
            # the row's columns (keel.srl.trajectory.StepRow)
            ("step_key", s), ("schema_version", i), ("collection", s), ("task_id", s),
            ("step", i), ("source", s), ("model", s), ("language", s), ("template", s),
            ("format_ok", b), ("verified", b), ("tests_passed", b), ("diff_lines", i),
            ("step_similarity", f), ("reward_total", f), ("record_json", s),
            ("record_digest", s), ("sample", i), ("seed", i),
            # the record's parts
            ("action", s), ("state_update", s), ("raw", s), ("format_error", s),
            ("state_before", s), ("state_after", s), ("temperature", f), ("top_p", f),
            ("max_tokens", i), ("prompt_tokens", i), ("completion_tokens", i),
            ("finish_reason", s), ("latency_s", f), ("cost_usd", f), ("endpoint", s),
            ("paper_reward", f), ("reward_version", s), ("effect", s), ("expert_action", s),
            ("expert_text_after", s), ("text_before", s), ("text_after", s),
            # TRL's conversational columns and the rewards (keel.srl.export)
            ("messages", chat), ("prompt", chat), ("completion", chat), ("prompt_json", s),
            ("think", s), ("think_source", s), ("reward", f), ("tests_passed_fraction", f),
            ("text_similarity", f), ("logprobs", pa.list_(f)), ("token_ids", pa.list_(i)),
        ]
    )  # fmt: skip


def write_export(
    rows: list[StepRow], out: Path, tasks: Mapping[str, SrlTask] | None = None
) -> dict[str, Path]:
    """``steps.jsonl`` (one §7 record a line) and ``steps.parquet``: the row's columns
    (rewards flat, sample and seed, the record as JSON text), the record's parts as
    columns of their own (action, state update, sampling, tokens, finish_reason, latency,
    cost, both rewards and what they are computed from), and TRL's conversational
    columns: ``messages`` (the chat sent, then the answer), ``prompt`` and ``completion``
    (docs/srl-export.md). ``tasks`` (by id; the collection's task file) give a gold
    replay's completion its expert's reasoning (:func:`keel.srl.export.gold_think`)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from keel.srl.export import trainer_columns
    from keel.srl.trajectory import StepRow

    schema = export_schema()
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "steps.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.record_json + "\n")
    columns: dict[str, list[Any]] = {c: [getattr(r, c) for r in rows] for c in StepRow.model_fields}
    extra = []
    for r in rows:
        task = (tasks or {}).get(r.task_id)
        record = json.loads(r.record_json)
        extra.append(
            _record_columns(r.record_json) | trainer_columns(record, source=r.source, task=task)
        )
    for name in schema.names:
        if name not in columns:
            columns[name] = [e[name] for e in extra]
    # tests_passed: a nullable bool (null where the task has no tests); the fraction of
    # tests passed is tests_passed_fraction.
    columns["tests_passed"] = [e["tests_passed"] for e in extra]
    for name in columns:  # a row column this schema does not name yet: inferred
        if name not in schema.names:
            kind = pa.array(columns[name]).type
            schema = schema.append(pa.field(name, pa.string() if kind == pa.null() else kind))
    table = pa.table({n: columns[n] for n in schema.names}, schema=schema)
    parquet = out / "steps.parquet"
    pq.write_table(table, parquet)
    return {"jsonl": jsonl, "parquet": parquet}
