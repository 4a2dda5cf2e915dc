"""Rule ``alarms``: every alarm watches a metric something emits (a custom metric: code a
runtime of the Terraform runs puts it, not code nothing deployed starts)."""

from __future__ import annotations

import re
from typing import Any

from keel.design.wiring.code import Metric, code_metrics, import_closure
from keel.design.wiring.images import runtimes
from keel.design.wiring.model import _LOG_WRITERS, AWS_NAMESPACES, Block, Finding, TfModule
from keel.design.wiring.permissions import runtime_files
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import job_runs
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


_Watched = tuple[str, str, frozenset[str]]


def _watched_metric(spec: dict[str, Any]) -> _Watched:
    """The (namespace, metric name, dimension names) that one metric spec with a ``metric_name`` names."""
    dims = spec.get("dimensions")
    return (
        str(spec.get("namespace", "")),
        str(spec["metric_name"]),
        frozenset(dims) if isinstance(dims, dict) else frozenset(),
    )


def _watched(body: dict[str, Any]) -> list[_Watched]:
    """Every metric an alarm body watches: its own ``metric_name``, then each ``metric_query`` metric."""
    watched: list[_Watched] = []
    if body.get("metric_name"):
        watched.append(_watched_metric(body))
    queries = body.get("metric_query") or []
    for query in queries if isinstance(queries, list) else [queries]:
        for metric in (query.get("metric") or []) if isinstance(query, dict) else []:
            metric = _unwrap(metric)
            if isinstance(metric, dict) and metric.get("metric_name"):
                watched.append(_watched_metric(metric))
    return watched


def _check_watched(
    mod: TfModule,
    writers: str,
    metrics: list[Metric],
    types: set[str],
    alarm: Block,
    watched: _Watched,
    deployed: frozenset[str] | None = None,
) -> Finding | None:
    """The finding, if any, for one metric an alarm watches: an AWS namespace needs a resource that
    emits there; a custom one needs a log metric filter or code that puts it with those dimensions,
    code that a runtime of the Terraform runs (``deployed``: the files their import closures hold).

    ``writers`` is the text of the module's log writers; ``types`` every resource type the Terraform creates."""
    namespace, name, dims = watched
    where = f"aws_cloudwatch_metric_alarm.{alarm.name}"
    if namespace in AWS_NAMESPACES or namespace.startswith("AWS/"):
        kinds = AWS_NAMESPACES.get(namespace, ())
        if types & set(kinds):
            return None
        return Finding(
            "alarms",
            alarm.file,
            f"{where} watches {namespace} {name}, but the Terraform creates "
            f"no {' or '.join(kinds) or 'resource that emits in ' + namespace}",
        )
    if _from_log_filter(mod, namespace, name, writers):
        return None
    coded = [m for m in metrics if m.name == name and _could_be(m.namespace, namespace)]
    if any(m.dimensions == dims and (deployed is None or m.file in deployed) for m in coded):
        return None
    if any(m.dimensions == dims for m in coded):
        shown = next(m.file for m in coded if m.dimensions == dims)
        return Finding(
            "alarms",
            alarm.file,
            f"{where} watches {namespace} {name}, which nothing deployed emits: {shown} "
            "puts it, but no runtime of the Terraform (task, scheduled task, function, "
            "SageMaker job or model, script job) runs that code",
        )
    if coded:
        return Finding(
            "alarms",
            alarm.file,
            f"{where} watches {namespace} {name} with dimensions "
            f"{sorted(dims) or 'none'}, but {coded[0].file} puts it with "
            f"{sorted(coded[0].dimensions) or 'none'}: no such metric exists",
        )
    return Finding(
        "alarms",
        alarm.file,
        f"{where} watches {namespace} {name}, which nothing emits: no log "
        "metric filter on a log group a runtime writes to, and no code puts it",
    )


def check_alarms(repo: Repo) -> list[Finding]:
    """Rule ``alarms``: every metric each CloudWatch alarm watches is emitted by something."""
    out: list[Finding] = []
    types = repo.resource_types()
    metrics = [
        m
        for path, text in sorted(repo.files.items())
        if path.endswith(".py") and not path.startswith("tests/")
        for m in code_metrics(path, text)
    ]
    deployed = _deployed_code(repo) if metrics else None
    for mod in repo.modules.values():
        writers = " ".join(_all_text(r.body) for r in mod.of_kind(*_LOG_WRITERS))
        for alarm in mod.of_kind("aws_cloudwatch_metric_alarm"):
            for watched in _watched(alarm.body):
                finding = _check_watched(mod, writers, metrics, types, alarm, watched, deployed)
                if finding is not None:
                    out.append(finding)
    return out


def _deployed_code(repo: Repo) -> frozenset[str] | None:
    """The Python files some runtime of the Terraform runs: the import closures of what
    each task, scheduled task, function, SageMaker job or model and script job starts.
    None when a runtime runs an image whose code is not found (the ``images`` rule reports
    it): that one might run anything, so no metric is called unemitted for it."""
    starts: list[str] = []
    for rt in runtimes(repo):
        files = runtime_files(repo, rt)
        if not files and rt.images:
            return None
        starts += files
    starts += [run.script for run in job_runs(repo) if run.script is not None]
    return frozenset(import_closure(repo.files, starts))


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
