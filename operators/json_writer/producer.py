"""Write the reduced value as canonical JSON (sorted keys, no spaces, UTF-8, one trailing
newline) and an audit log beside it (``<file>.audit.jsonl``). Same value, same bytes."""

from __future__ import annotations

from pathlib import Path

from pydantic import JsonValue

from keel.digest import canonical_json, digest_json
from keel.mrp.dsl import SinkSpec
from keel.mrp.sdk import (
    OperatorContext,
    ProducerBase,
    ProduceResult,
    audit_log_bytes,
    sink_file_name,
    write_output,
)


class JsonWriter(ProducerBase):
    """``params.wrap`` (default true) writes ``{"data": value}``; false writes the value."""

    def produce(
        self, reduced: JsonValue, sink: SinkSpec, out_dir: Path, ctx: OperatorContext
    ) -> ProduceResult:
        wrap = bool(ctx.params.get("wrap", True))
        body: JsonValue = {"data": reduced} if wrap else reduced
        name = sink_file_name(sink)
        data = write_output(out_dir, name, canonical_json(body) + b"\n")
        rows = len(reduced) if isinstance(reduced, list) else 1
        audit: list[dict[str, JsonValue]] = [
            {
                "event": "produce",
                "operator": ctx.operator,
                "sink_kind": sink.kind.value,
                "destination": sink.destination,
                "input_digest": digest_json(reduced),
                "file": data.path,
                "digest": data.digest,
                "size": data.size,
                "rows": rows,
                "seed": ctx.seed,
                **ctx.run_audit(),
            }
        ]
        log = write_output(out_dir, f"{name}.audit.jsonl", audit_log_bytes(audit))
        ctx.log(f"wrote {data.path} ({data.size} bytes)")
        return ProduceResult(files=[data, log], rows=rows, audit=audit)
