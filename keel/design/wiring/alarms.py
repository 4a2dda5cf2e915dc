"""Rule ``alarms``: every alarm watches a metric something emits."""

from __future__ import annotations

import re

from keel.design.wiring.code import code_metrics
from keel.design.wiring.model import _LOG_WRITERS, AWS_NAMESPACES, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _unwrap


def _could_be(pattern: str, value: str) -> bool:
    """Whether a code namespace pattern (a regex) may be ``value`` (Terraform text whose
    ``${...}`` parts are unknown)."""
    probe = re.sub(r"\$\{[^}]*\}", "x", value)
    if re.fullmatch(pattern, probe):
        return True
    literal = re.escape(value)
    loose = re.sub(r"\\\$\\\{.*?\\\}", ".+", literal)
    return bool(re.fullmatch(loose, pattern.replace("\\", "")))


def check_alarms(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    types = repo.resource_types()
    metrics = [
        m
        for path, text in sorted(repo.files.items())
        if path.endswith(".py") and not path.startswith("tests/")
        for m in code_metrics(path, text)
    ]
    for mod in repo.modules.values():
        writers = " ".join(_all_text(r.body) for r in mod.of_kind(*_LOG_WRITERS))
        for alarm in mod.of_kind("aws_cloudwatch_metric_alarm"):
            where = f"aws_cloudwatch_metric_alarm.{alarm.name}"
            watched: list[tuple[str, str, frozenset[str]]] = []
            body = alarm.body
            if body.get("metric_name"):
                dims = body.get("dimensions")
                watched.append(
                    (
                        str(body.get("namespace", "")),
                        str(body["metric_name"]),
                        frozenset(dims) if isinstance(dims, dict) else frozenset(),
                    )
                )
            queries = body.get("metric_query") or []
            for query in queries if isinstance(queries, list) else [queries]:
                for metric in (query.get("metric") or []) if isinstance(query, dict) else []:
                    metric = _unwrap(metric)
                    if isinstance(metric, dict) and metric.get("metric_name"):
                        dims = metric.get("dimensions")
                        watched.append(
                            (
                                str(metric.get("namespace", "")),
                                str(metric["metric_name"]),
                                frozenset(dims) if isinstance(dims, dict) else frozenset(),
                            )
                        )
            for namespace, name, dims in watched:
                if namespace in AWS_NAMESPACES or namespace.startswith("AWS/"):
                    kinds = AWS_NAMESPACES.get(namespace, ())
                    if not types & set(kinds):
                        out.append(
                            Finding(
                                "alarms",
                                alarm.file,
                                f"{where} watches {namespace} {name}, but the Terraform creates "
                                f"no {' or '.join(kinds) or 'resource that emits in ' + namespace}",
                            )
                        )
                    continue
                if _from_log_filter(mod, namespace, name, writers):
                    continue
                coded = [m for m in metrics if m.name == name and _could_be(m.namespace, namespace)]
                if any(m.dimensions == dims for m in coded):
                    continue
                if coded:
                    out.append(
                        Finding(
                            "alarms",
                            alarm.file,
                            f"{where} watches {namespace} {name} with dimensions "
                            f"{sorted(dims) or 'none'}, but {coded[0].file} puts it with "
                            f"{sorted(coded[0].dimensions) or 'none'}: no such metric exists",
                        )
                    )
                    continue
                out.append(
                    Finding(
                        "alarms",
                        alarm.file,
                        f"{where} watches {namespace} {name}, which nothing emits: no log "
                        "metric filter on a log group a runtime writes to, and no code puts it",
                    )
                )
    return out


def _from_log_filter(mod: TfModule, namespace: str, name: str, writers: str) -> bool:
    for filt in mod.of_kind("aws_cloudwatch_log_metric_filter"):
        tr = _unwrap(filt.body.get("metric_transformation"))
        if not isinstance(tr, dict) or tr.get("name") != name or tr.get("namespace") != namespace:
            continue
        group = re.match(
            r"^\$\{aws_cloudwatch_log_group\.(\w+)\.name\}$",
            str(filt.body.get("log_group_name", "")),
        )
        if group and f"aws_cloudwatch_log_group.{group.group(1)}." in writers:
            return True
    return False
