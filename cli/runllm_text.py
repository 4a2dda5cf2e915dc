"""How ``runllm`` reads as text: ``validate``, ``inspect``, ``stats``, ``exectime`` and a
run's result, for people (JSON mode prints the documents). Each function returns the
lines to print, joined; none imports Temporal or LiteLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.rllm.deps import ResolvedApp
    from keel.settings import Settings


def validate_text(file: Path, resolved: ResolvedApp, names: dict[str, str]) -> str:
    """``app.rllm: ok: name version (format N)`` and one line per app it uses."""
    root = resolved.root
    lines = [f"{file}: ok: {root.name} {root.version} (format {root.format_version})"]
    for key in resolved.graph.order():
        p = resolved.programs[key]
        model = names.get(
            key, "no model call" if not p.needs_llm else f"{p.llm.provider}/{p.llm.model}"
        )
        lines.append(f"  {key}: {p.name} {p.version}, model {model}")
    return "\n".join(lines)


# -- inspect ---------------------------------------------------------------------------


def _app_doc(resolved: ResolvedApp) -> dict[str, Any]:
    """The ``app``, ``llm`` and ``contracts`` parts of ``inspect``'s document."""
    root = resolved.root
    return {
        "app": {
            "name": root.name,
            "version": root.version,
            "format_version": root.format_version,
            "description": root.description,
            "author": root.author,
            "tags": root.tags,
            "metadata": root.metadata,
            "source_path": root.source_path,
            "source_digest": root.source_digest,
        },
        "llm": {
            "provider": root.llm.provider,
            "model": root.llm.model,
            "llm_params": root.llm_params,
            "max_context_window": root.max_context_window,
            "max_tokens": root.max_tokens,
            "needs_llm": root.needs_llm,
            "recommended_models": [m.litellm_model for m in root.recommended_models],
        },
        "contracts": {
            "input_schema": root.input_schema,
            "output_schema": root.output_schema,
            "llm_output_schema": root.llm_output_schema() if root.needs_llm else None,
            "output_map": root.output_map,
            "output_format": root.output_format,
        },
    }


def _graph_doc(resolved: ResolvedApp) -> dict[str, Any]:
    """The ``graph`` part of ``inspect``'s document: the apps it uses and their edges."""
    return {
        "root": resolved.graph.root,
        "order": resolved.graph.order(),
        "digest": resolved.graph.digest(),
        "nodes": {
            k: {
                "name": n.name,
                "version": n.version,
                "needs_llm": n.needs_llm,
                "llm": f"{n.llm.provider}/{n.llm.model}",
                "source_digest": n.source_digest,
            }
            for k, n in resolved.graph.nodes.items()
        },
        "edges": [e.model_dump() for e in resolved.graph.edges],
    }


def inspect_tree(resolved: ResolvedApp) -> dict[str, Any]:
    """``inspect``'s document: metadata, contracts, templates, blocks, dependency graph."""
    from keel.rllm.render import template_refs

    root = resolved.root
    return {
        **_app_doc(resolved),
        "templates": {
            "prompt": root.prompt_template,
            "prompt_variables": sorted({r.name for r in template_refs(root.prompt_template)}),
            "recovery": root.recovery_template,
        },
        "python_blocks": [
            b.model_dump(include={"name", "stage", "inputs", "outputs", "line"})
            for b in root.python_blocks
        ],
        "uses": [u.model_dump() for u in root.uses],
        "graph": _graph_doc(resolved),
    }


def inspect_text(tree: dict[str, Any]) -> str:
    """``inspect``'s document for people."""
    a, llm, c = tree["app"], tree["llm"], tree["contracts"]
    lines = [f"{a['name']} {a['version']} (format {a['format_version']}) by {a['author']}"]
    lines.append(f"  {a['description']}")
    if llm["needs_llm"]:
        lines.append(
            f"model: {llm['provider']}/{llm['model']}  window {llm['max_context_window']}, "
            f"max_tokens {llm['max_tokens']}  params {json.dumps(llm['llm_params'])}"
        )
    else:
        lines.append("model: none (every output field comes from output_map)")
    if llm["recommended_models"]:
        lines.append(f"recommended: {', '.join(llm['recommended_models'])}")
    lines.append("input:")
    lines += _schema_lines(c["input_schema"])
    lines.append("output:")
    lines += _schema_lines(c["output_schema"], c["output_map"])
    if tree["templates"]["prompt_variables"]:
        lines.append(f"prompt variables: {', '.join(tree['templates']['prompt_variables'])}")
    if llm["needs_llm"]:
        lines.append(f"recovery prompt: {'own' if tree['templates']['recovery'] else 'default'}")
    for b in tree["python_blocks"]:
        lines.append(
            f"python {b['stage']} block {b['name']} (line {b['line']}): "
            f"{', '.join(b['inputs']) or '-'} -> {', '.join(b['outputs'])}"
        )
    g = tree["graph"]
    if g["edges"]:
        lines.append("dependency graph:")
        lines += _graph_lines(g, g["root"], "  ", set())
        lines.append(f"run order: {' -> '.join(g['order'])}")
    return "\n".join(lines)


def _schema_lines(schema: dict[str, Any], output_map: dict[str, str] | None = None) -> list[str]:
    required = set(schema.get("required", []))
    lines = []
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type", "any")
        kind = "/".join(kind) if isinstance(kind, list) else kind
        if kind == "array" and isinstance(prop.get("items"), dict):
            kind = f"array of {prop['items'].get('type', 'any')}"
        extra = []
        if name in required:
            extra.append("required")
        if "default" in prop:
            extra.append(f"default {json.dumps(prop['default'])}")
        if output_map and name in output_map:
            extra.append(f"from {output_map[name]}")
        desc = f"  {prop['description']}" if prop.get("description") else ""
        lines.append(f"  {name}: {kind}{' (' + ', '.join(extra) + ')' if extra else ''}{desc}")
    return lines


def _graph_lines(g: dict[str, Any], key: str, indent: str, seen: set[str]) -> list[str]:
    node = g["nodes"][key]
    lines = [
        f"{indent}{key} ({node['name']} {node['version']}, {node['llm'] if node['needs_llm'] else 'no model call'})"
    ]
    if key in seen:
        return lines
    seen.add(key)
    for e in g["edges"]:
        if e["parent"] == key:
            maps = ", ".join(f"{k} <- {v}" for k, v in e["input_map"].items())
            after = f", after {', '.join(e['after'])}" if e["after"] else ""
            lines.append(
                f"{indent}  as {e['alias']}: exposes {', '.join(e['exposes'])}; {maps}{after}"
            )
            lines += _graph_lines(g, e["child"], indent + "    ", seen)
    return lines


# -- stats / exectime ------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def stats_text(apps: list[dict[str, Any]], model: str | None) -> str:
    """Each app's recorded runs: two lines per app version and model."""
    lines = []
    for entry in apps:
        lines.append(f"{entry['key']} ({entry['app']}, file version {entry['version']}):")
        if not entry["stats"]:
            lines.append("  no recorded runs" + (f" on {model}" if model else ""))
        for s in entry["stats"]:
            lines.append(
                f"  v{s['app_version']} on {s['model']}: {s['runs']} runs, "
                f"{s['successes']} ok, {s['failures']} failed; input compliance "
                f"{_pct(s['input_compliance_pct'])}, output {_pct(s['output_compliance_pct'])}"
            )
            lines.append(
                f"    avg {s['avg_latency_ms']:.0f} ms (model {s['avg_llm_latency_ms']:.0f} ms), "
                f"tokens {s['avg_prompt_tokens']:.0f} in / {s['avg_completion_tokens']:.0f} out "
                f"(max out {s['max_completion_tokens']}), {_num(s['ms_per_1k_tokens'])} ms/1k tokens, "
                f"{s['avg_retries']:.2f} retries, {_num(s['tokens_per_attempt'])} tokens/attempt"
            )
    return "\n".join(lines)


def exectime_text(out: dict[str, Any]) -> str:
    """The predicted wall time, each part's share and the apps with no recorded runs."""
    total, tokens = out["predicted_ms"], out["prompt_tokens"]
    lines = [
        f"{out['app']}: "
        + (f"about {total / 1000:.2f} s" if total is not None else "no prediction")
        + (f" for a prompt of ~{tokens} tokens" if tokens is not None else "")
    ]
    for part in out["parts"]:
        ms = part["predicted_ms"]
        lines.append(
            f"  {part['key']}: {part['app']} v{part['app_version']} on {part['model']}: "
            + (
                f"{ms:.0f} ms from {part['runs']} runs ({part['basis']})"
                if ms is not None
                else "no recorded runs"
            )
        )
    if out["missing"]:
        lines.append(f"run these first: {', '.join(out['missing'])}")
    return "\n".join(lines)


# -- run -------------------------------------------------------------------------------


def result_text(wid: str, result: Any, settings: Settings, verbose: bool) -> str:
    """A run's head line and output (with ``--verbose``: its attempts and workflow)."""
    r = result
    attempts = len(r.attempts)
    head = f"{r.app} {r.version}" + (f" on {r.model}" if r.model else "")
    lines = [
        f"{head}: ok after {attempts} attempt{'s' if attempts != 1 else ''} "
        f"({r.retries} retr{'ies' if r.retries != 1 else 'y'}), {r.usage.total_tokens} tokens, "
        f"model {r.llm_latency_ms:.0f} ms, total {r.total_latency_ms:.0f} ms",
        json.dumps(r.output, indent=2, ensure_ascii=False),
    ]
    if verbose:
        lines += _attempt_lines(r, "")
        lines.append(f"workflow {wid}")
        if not settings.temporal_address:
            from services.up import ui_link

            lines.append(f"  {ui_link(settings, wid)}  (while keel up runs)")
    return "\n".join(lines)


def _attempt_lines(r: Any, indent: str) -> list[str]:
    lines = []
    for a in r.attempts:
        state = "ok" if a.ok else "invalid"
        lines.append(
            f"{indent}attempt {a.attempt} ({a.model_name}): {state}, "
            f"{a.usage.prompt_tokens}+{a.usage.completion_tokens} tokens, {a.latency_ms:.0f} ms"
        )
        lines += [f"{indent}  - {e}" for e in a.errors]
    for alias, child in r.children.items():
        lines.append(
            f"{indent}uses {alias}: {child.app} {child.version}: {len(child.attempts)} attempts, "
            f"{child.usage.total_tokens} tokens"
        )
        lines += _attempt_lines(child, indent + "  ")
    return lines
