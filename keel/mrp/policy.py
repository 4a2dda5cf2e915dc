"""Admission: the named policy rules a job must pass before anything runs.

:func:`admit` evaluates every rule in :data:`RULES` against a normalised job, the operator
registry and the service's :class:`Caps`, and returns a :class:`PolicyReport` listing each
rule's outcome and every violation (not just the first), so one compile shows everything
to fix. The compiler fails closed on any violation. ``docs/mrp-dsl.md`` has the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keel.digest import digest_json
from keel.mrp.budget import DEFAULT_KILL_RATIO, CostEstimate, estimate_cost
from keel.mrp.dsl import URI_RE, EgressName, InputsSpec, SinkKind, destination_problem, nearest_line
from keel.mrp.errors import MrpError
from keel.mrp.ir import ROLE_KINDS
from keel.mrp.normalize import NormalizedJob
from keel.mrp.registry import OperatorSpec, Registry
from keel.problems import at_path

# Where each role's operator sits in a job file.
ROLE_PATHS = {"map": "map", "reduce": "reduce", "evaluate": "evaluator", "produce": "produce"}


class Caps(BaseModel):
    """The service's limits and allow-lists (from ``configs/``); jobs ask, caps decide.

    Defaults are safe for a single machine: no network egress, local sinks only, no
    signature or approval requirement.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_workers: int = Field(default=32, ge=1)
    max_shard_timeout_s: float = Field(default=3600, gt=0)
    max_shard_memory_mb: int = Field(default=8192, ge=16)
    max_shard_retries: int = Field(default=5, ge=0)
    max_shards: int = Field(default=10_000, ge=1)
    allowed_egress: list[EgressName] = Field(
        default_factory=list, description="Egress classes jobs may ask for; none by default."
    )
    allowed_sinks: list[SinkKind] = Field(default_factory=lambda: [SinkKind.JSON, SinkKind.PARQUET])
    allowed_destination_prefixes: list[str] = Field(
        default_factory=list,
        description="URI prefixes (s3://bucket/prefix/) a sink may write to. Relative "
        "paths, which stay under the run's output root, are always allowed.",
    )
    allowed_input_prefixes: list[str] = Field(
        default_factory=list,
        description="s3:// prefixes (s3://bucket/prefix/) job inputs may be read from; none "
        "by default. Relative inputs, under the run's base_dir, are always allowed.",
    )
    max_budget_usd: Decimal | None = Field(default=None, ge=0)
    max_budget_units: Decimal | None = Field(default=None, ge=0)
    usd_per_unit: Decimal = Field(default=Decimal(0), ge=0)
    kill_ratio: Decimal = Field(default=DEFAULT_KILL_RATIO, ge=1)
    require_approval: bool = False
    require_signatures: bool = False

    @field_validator(
        "allowed_egress", "allowed_sinks", "allowed_destination_prefixes", "allowed_input_prefixes"
    )
    @classmethod
    def _sorted(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    def digest(self) -> str:
        """Digest of the caps, recorded in the policy report. Caps that allow no input
        prefix digest as they did before that cap existed."""
        data = self.model_dump(mode="json")
        if not data["allowed_input_prefixes"]:
            del data["allowed_input_prefixes"]
        return digest_json(data)

    def input_allowed(self, uri: str) -> bool:
        """Whether an ``s3://`` input pattern lies under an allowed input prefix."""
        return any(uri.startswith(prefix) for prefix in self.allowed_input_prefixes)


class Violation(BaseModel):
    """One rule firing on one place in the job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule_id: str
    title: str
    path: str
    line: int | None = None
    message: str

    def render(self) -> str:
        """``MRP-P001 max_workers over cap at policy.max_workers (line 30): ...``."""
        return f"{self.rule_id} {self.title}{at_path(self.path, self.line)}: {self.message}"


class RuleOutcome(BaseModel):
    """What one rule concluded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule_id: str
    title: str
    status: Literal["passed", "violated", "skipped"]
    reason: str = ""


class PolicyReport(BaseModel):
    """Every rule's outcome, every violation, the estimate and the caps they were judged by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    job_digest: str
    caps_digest: str
    rules_evaluated: list[RuleOutcome]
    violations: list[Violation]
    estimate: CostEstimate | None

    @property
    def admitted(self) -> bool:
        """True when no rule fired."""
        return not self.violations

    def digest(self) -> str:
        """Digest of the report."""
        return digest_json(self)


@dataclass(frozen=True)
class Admission:
    """What a rule looks at."""

    job: NormalizedJob
    registry: Registry
    caps: Caps
    specs: Mapping[str, OperatorSpec]  # the roles whose operator resolved
    estimate: CostEstimate | None  # None when an operator did not resolve


Finding = tuple[str, str]  # (dotted path in the job, message)


class Skip(Exception):
    """A rule cannot be judged (its inputs are missing); another rule has said why."""


@dataclass(frozen=True)
class Rule:
    """A named admission rule."""

    rule_id: str
    title: str
    check: Callable[[Admission], list[Finding]]


def _over(path: str, asked: object, cap: object, what: str) -> list[Finding]:
    return [(path, f"asks for {asked} {what}; the cap is {cap}")]


def _max_workers(a: Admission) -> list[Finding]:
    p = a.job.spec.policy
    if p.max_workers > a.caps.max_workers:
        return _over("policy.max_workers", p.max_workers, a.caps.max_workers, "workers")
    return []


def _shard_timeout(a: Admission) -> list[Finding]:
    p = a.job.spec.policy
    if p.shard_timeout_s > a.caps.max_shard_timeout_s:
        return _over(
            "policy.shard_timeout_s", p.shard_timeout_s, a.caps.max_shard_timeout_s, "seconds"
        )
    return []


def _shard_memory(a: Admission) -> list[Finding]:
    p = a.job.spec.policy
    if p.shard_memory_mb > a.caps.max_shard_memory_mb:
        return _over("policy.shard_memory_mb", p.shard_memory_mb, a.caps.max_shard_memory_mb, "MB")
    return []


def _shard_retries(a: Admission) -> list[Finding]:
    p = a.job.spec.policy
    if p.max_shard_retries > a.caps.max_shard_retries:
        return _over(
            "policy.max_shard_retries", p.max_shard_retries, a.caps.max_shard_retries, "retries"
        )
    return []


def _too_many_shards(a: Admission) -> list[Finding]:
    n = a.job.shard_count
    if n > a.caps.max_shards:
        inputs = a.job.spec.inputs
        if inputs.format is not None:
            key = "records_per_shard" if inputs.records_per_shard is not None else "bytes_per_shard"
            return [
                (
                    f"inputs.{key}",
                    f"the inputs make {n} shards ({a.job.item_count} records, "
                    f"{key} {getattr(inputs, key)}); the cap is {a.caps.max_shards}",
                )
            ]
        path = "inputs.shard_size" if inputs.shard_size is not None else "inputs.by"
        return [
            (
                path,
                f"the inputs make {n} shards ({a.job.item_count} items, "
                f"{inputs.items_per_shard} per shard); the cap is {a.caps.max_shards}",
            )
        ]
    return []


def _refs(a: Admission) -> dict[str, str]:
    return a.job.spec.operator_refs()


def _registered(a: Admission) -> list[Finding]:
    out: list[Finding] = []
    for role, ref in _refs(a).items():
        if role not in a.specs:
            try:
                a.registry.get(ref)
            except LookupError as e:
                out.append((f"{ROLE_PATHS[role]}.operator", str(e)))
    return out


def _allow_listed(a: Admission) -> list[Finding]:
    out: list[Finding] = []
    own = a.job.spec.policy.allowed_operators
    for role, spec in a.specs.items():
        path = f"{ROLE_PATHS[role]}.operator"
        problem = a.registry.allow_problem(spec)
        if problem is not None:
            out.append((path, problem))
        if own is not None and spec.ref not in own:
            out.append((path, f"operator {spec.ref} is not in the job's policy.allowed_operators"))
    return out


def _kind(a: Admission) -> list[Finding]:
    out: list[Finding] = []
    for role, spec in a.specs.items():
        if spec.kind is not ROLE_KINDS[role]:
            out.append(
                (
                    f"{ROLE_PATHS[role]}.operator",
                    f"operator {spec.ref} is a {spec.kind.value} operator, "
                    f"not a {ROLE_KINDS[role].value} operator",
                )
            )
    return out


def _sink(a: Admission) -> list[Finding]:
    sink = a.job.spec.produce.sink
    own = a.job.spec.policy.allowed_sinks
    out: list[Finding] = []
    if sink.kind not in a.caps.allowed_sinks:
        allowed = ", ".join(a.caps.allowed_sinks) or "none"
        out.append(
            (
                "produce.sink.kind",
                f"sink kind {sink.kind.value!r} is not allowed (allowed: {allowed})",
            )
        )
    if own is not None and sink.kind not in own:
        out.append(
            ("produce.sink.kind", f"sink kind {sink.kind.value!r} is not in policy.allowed_sinks")
        )
    if URI_RE.match(sink.destination) and not any(
        sink.destination.startswith(prefix) for prefix in a.caps.allowed_destination_prefixes
    ):
        out.append(
            (
                "produce.sink.destination",
                f"destination {sink.destination!r} is outside the allowed prefixes "
                f"({', '.join(a.caps.allowed_destination_prefixes) or 'none'})",
            )
        )
    producer = a.specs.get("produce")
    # A producer of the wrong kind is MRP-P008's finding; it lists no sinks to check.
    if (
        producer is not None
        and producer.kind is ROLE_KINDS["produce"]
        and sink.kind not in producer.sinks
    ):
        out.append(
            (
                "produce.sink.kind",
                f"operator {producer.ref} writes {', '.join(producer.sinks)}, "
                f"not {sink.kind.value}",
            )
        )
    return out


def _writable(a: Admission) -> list[Finding]:
    # Policy and runtime must agree: a destination the caps admit but the runtime cannot
    # write would fail only after the map has spent the budget.
    problem = destination_problem(a.job.spec.produce.sink.destination)
    return [("produce.sink.destination", problem)] if problem else []


def _egress(a: Admission) -> list[Finding]:
    granted = a.job.spec.policy.egress
    out: list[Finding] = []
    for name in granted:
        if name not in a.caps.allowed_egress:
            out.append(
                (
                    "policy.egress",
                    f"egress {name!r} is not allowed by the service "
                    f"(allowed: {', '.join(a.caps.allowed_egress) or 'none'})",
                )
            )
    for role, spec in a.specs.items():
        for name in spec.egress:
            if name not in granted:
                out.append(
                    (
                        f"{ROLE_PATHS[role]}.operator",
                        f"operator {spec.ref} needs egress {name!r}, "
                        "which policy.egress does not grant",
                    )
                )
    return out


def _over_budget(a: Admission) -> list[Finding]:
    if a.estimate is None:
        raise Skip("an operator did not resolve, so the job cannot be estimated")
    p = a.job.spec.policy
    out: list[Finding] = []
    if p.budget_units is not None and a.estimate.units > p.budget_units:
        out.append(
            (
                "policy.budget_units",
                f"estimated {a.estimate.units} units exceeds the budget of {p.budget_units}",
            )
        )
    if p.budget_usd is not None and a.estimate.usd > p.budget_usd:
        out.append(
            (
                "policy.budget_usd",
                f"estimated ${a.estimate.usd} exceeds the budget of ${p.budget_usd}",
            )
        )
    return out


def _budget_cap(a: Admission) -> list[Finding]:
    p, c = a.job.spec.policy, a.caps
    out: list[Finding] = []
    for field, asked, cap in (
        ("budget_usd", p.budget_usd, c.max_budget_usd),
        ("budget_units", p.budget_units, c.max_budget_units),
    ):
        if cap is None:
            continue
        if asked is None:
            out.append((f"policy.{field}", f"the service caps {field} at {cap}; set it"))
        elif asked > cap:
            out.append((f"policy.{field}", f"asks for {asked}; the cap is {cap}"))
    return out


def _gated(a: Admission) -> list[Finding]:
    if a.caps.require_approval and a.job.spec.approval is None:
        return [("approval", "the service requires an approval gate before produce")]
    return []


def _signed(a: Admission) -> list[Finding]:
    if not a.caps.require_signatures:
        return []
    return [
        (f"{ROLE_PATHS[role]}.operator", f"operator {spec.ref} is not signed")
        for role, spec in a.specs.items()
        if spec.signature is None
    ]


def input_source_findings(inputs: InputsSpec, caps: Caps) -> list[Finding]:
    """``s3://`` inputs outside ``caps.allowed_input_prefixes`` (MRP-P015). The compile
    activity asks this before it lists a bucket, so a refused prefix is never read."""
    out: list[Finding] = []
    for i, pattern in enumerate(inputs.files or []):
        if "://" in pattern and not caps.input_allowed(pattern):
            allowed = ", ".join(caps.allowed_input_prefixes) or "none"
            out.append(
                (
                    f"inputs.files[{i}]",
                    f"input {pattern!r} is outside the allowed input prefixes ({allowed})",
                )
            )
    return out


def _input_sources(a: Admission) -> list[Finding]:
    return input_source_findings(a.job.spec.inputs, a.caps)


RULES: tuple[Rule, ...] = (
    Rule("MRP-P001", "max_workers over cap", _max_workers),
    Rule("MRP-P002", "shard timeout over cap", _shard_timeout),
    Rule("MRP-P003", "shard memory over cap", _shard_memory),
    Rule("MRP-P004", "shard retries over cap", _shard_retries),
    Rule("MRP-P005", "too many shards", _too_many_shards),
    Rule("MRP-P006", "operator not registered", _registered),
    Rule("MRP-P007", "operator not allow-listed", _allow_listed),
    Rule("MRP-P008", "operator kind mismatch", _kind),
    Rule("MRP-P009", "sink not allowed", _sink),
    Rule("MRP-P010", "egress not allowed", _egress),
    Rule("MRP-P011", "estimated cost over budget", _over_budget),
    Rule("MRP-P012", "budget over cap", _budget_cap),
    Rule("MRP-P013", "produce not gated", _gated),
    Rule("MRP-P014", "operator not signed", _signed),
    Rule("MRP-P015", "input source not allowed", _input_sources),
    Rule("MRP-P016", "sink not writable", _writable),
)
RULES_BY_ID = {r.rule_id: r for r in RULES}


def admit(
    job: NormalizedJob,
    registry: Registry,
    caps: Caps,
    lines: Mapping[str, int] | None = None,
) -> PolicyReport:
    """Evaluate every rule; never raises for a bad job (the report says what fired).

    ``lines`` (from :class:`~keel.mrp.dsl.ParsedJob`) puts line numbers on violations.
    """
    specs: dict[str, OperatorSpec] = {}
    for role, ref in job.spec.operator_refs().items():
        spec = registry.find(ref)
        if spec is not None:
            specs[role] = spec
    estimate = None
    if len(specs) == len(job.spec.operator_refs()):
        estimate = estimate_cost(specs, job.shard_count, job.item_count, caps.usd_per_unit)
    ctx = Admission(job=job, registry=registry, caps=caps, specs=specs, estimate=estimate)
    outcomes: list[RuleOutcome] = []
    violations: list[Violation] = []
    for rule in RULES:
        try:
            findings = rule.check(ctx)
        except Skip as s:
            outcomes.append(
                RuleOutcome(rule_id=rule.rule_id, title=rule.title, status="skipped", reason=str(s))
            )
            continue
        outcomes.append(
            RuleOutcome(
                rule_id=rule.rule_id,
                title=rule.title,
                status="violated" if findings else "passed",
            )
        )
        for path, message in findings:
            violations.append(
                Violation(
                    rule_id=rule.rule_id,
                    title=rule.title,
                    path=path,
                    line=nearest_line(lines, path) if lines else None,
                    message=message,
                )
            )
    return PolicyReport(
        job_id=job.spec.job_id,
        job_digest=job.job_digest,
        caps_digest=caps.digest(),
        rules_evaluated=outcomes,
        violations=violations,
        estimate=estimate,
    )


class PolicyViolation(MrpError):
    """Admission refused the job: at least one policy rule fired.

    ``rule_ids`` names every rule that fired, in rule order; ``report`` is the full
    :class:`PolicyReport`, so a caller can show every violation at once.
    """

    def __init__(self, report: PolicyReport) -> None:
        self.report = report
        self.rule_ids = [v.rule_id for v in report.violations]
        lines = [v.render() for v in report.violations]
        super().__init__("job refused by policy:\n  " + "\n  ".join(lines))
