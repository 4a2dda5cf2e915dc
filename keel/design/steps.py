"""The design pipeline as a workflow sees it: its input, Update and query models, each
activity's input and output, and the activity references.

``workflows/design/`` runs ``DesignPipeline`` (the 12 nodes of plan §21.1 as a LangGraph
graph); the activities in ``activities/design/`` implement each reference under the same
name. Pure models: no I/O. The generated repository and the validation report live in the
artifact store; history carries their digests and small summaries only.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keel.design.constraints import Constraints
from keel.design.coverage import DEFAULT_THRESHOLD, Coverage, IntakeSnapshot, Question
from keel.design.critics import CostEstimate, PriceTable
from keel.design.patterns import PatternCatalog
from keel.design.planner import Plan
from keel.design.policy import PolicyReport, PolicySettings
from keel.gates import MAX_WAIT_S
from keel.ids import SHORT_ID_PATTERN
from keel.refs import ActivityRef

WORKFLOW_TYPE: Final = "DesignPipeline"
#: Node names in the fixed order of plan §21.1.
NODES: Final = (
    "intake_extract",
    "coverage_check",
    "adaptive_questions",
    "planner",
    "critic_tech",
    "critic_cost",
    "critic_security",
    "policy_eval",
    "gate_hitl",
    "codegen",
    "validators",
    "rationale_compile",
    "diff_and_persist",
)
#: ApplicationError types that are final (not retried).
ERROR_DESIGN_INPUT: Final = "DesignInputInvalid"
ERROR_DESIGN_CONFIG: Final = "DesignConfigInvalid"
ERROR_DESIGN_CONFLICT: Final = "DesignVersionConflict"
#: An extractor reply that is not the Constraint Schema. No longer raised (a reply that
#: does not fit becomes questions, keel.design.intake); kept for runs recorded before.
ERROR_DESIGN_EXTRACT: Final = "DesignExtractInvalid"
#: The intake model could not be reached (connection refused, timed out, server errors
#: past the retries): the message names the model, its address and what to check.
ERROR_DESIGN_MODEL_UNREACHABLE: Final = "DesignModelUnreachable"
#: A codegen model's answer is not a usable repository (retried: a model may do better).
ERROR_DESIGN_CODEGEN: Final = "DesignCodegenInvalid"

_ID = SHORT_ID_PATTERN
#: The codegen providers ``DesignInput.codegen`` may name (activities/design/codegen.py).
CodegenProvider = Literal["template", "litellm", "anthropic"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def workflow_id(project: str, decision_set: str) -> str:
    """The id of a decision set's pipeline: ``design/<project>/<decision set>``."""
    return f"design/{project}/{decision_set}"


#: The validators of a generated repository, in the order every report lists them
#: (activities/design/validators).
VALIDATORS = (
    "secrets",
    "ruff",
    "mypy",
    "pytest",
    "smoke",
    "hcl",
    "checkov",
    "actionlint",
    "hadolint",
    "sbom",
    "wiring",
)


def selected_validators(names: list[str] | None) -> list[str] | None:
    """A run's choice of validators (``DesignOptions.validators``, the API's generate
    body): None (every one), else the names in :data:`VALIDATORS`' order.

    Raises:
        ValueError: an unknown name, or none named.
    """
    if names is None:
        return None
    unknown = sorted(set(names) - set(VALIDATORS))
    if unknown:
        raise ValueError(
            f"unknown validator(s) {', '.join(unknown)}; known: {', '.join(VALIDATORS)}"
        )
    if not names:
        raise ValueError("name at least one validator, or leave validators out to run every one")
    return [n for n in VALIDATORS if n in names]


class DesignOptions(_Model):
    """What the caller of a decision set chooses (``POST /design/projects/{id}/constraints`` takes
    exactly these); :class:`DesignInput` adds who and which, from the path and the caller.

    ``requirements`` is free text for ``intake_extract``; ``intake`` is the guided mode's
    whole form (``{field: value}`` of the Constraint Schema), which skips extraction. With
    ``previous_decision_set`` (an approved one) the run starts from its constraints, and
    the cost critic and the diff compare against it.
    """

    requirements: str = Field(default="", max_length=20_000)
    intake: dict[str, Any] | None = None
    previous_decision_set: str | None = Field(default=None, pattern=_ID)
    model: str = Field(default="", description="Models-config name for intake; empty: default")
    coverage_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0, le=1)
    approvers: list[str] = Field(default_factory=list)
    require_approval: bool = Field(
        default=True,
        description="Open the gate on every round. False: only when policy fails or the "
        "cost delta is over the threshold (plan §23.5).",
    )
    # Bounded like the gate's own expiry: a longer one would fail the gate's input.
    gate_expires_in_s: float = Field(default=7 * 24 * 3600, gt=0, le=MAX_WAIT_S)
    max_plan_rounds: int = Field(default=3, ge=1, le=10)
    max_question_rounds: int = Field(default=5, ge=1, le=20)
    generate: bool = Field(default=True, description="Run codegen and validators")
    webhook_url: str | None = Field(
        default=None,
        description="Where plan.ready, gate.waiting, run.complete and run.error are POSTed "
        "(HMAC-signed; the worker's KEEL_WEBHOOK_URL or under KEEL_WEBHOOK_ALLOWED_PREFIXES). "
        "None: no notices.",
    )
    codegen: CodegenProvider = Field(
        default="template",
        description="Who writes the repository: the deterministic templates, a model of the "
        "models config through LiteLLM, or Anthropic's API",
    )
    codegen_model: str = Field(
        default="",
        max_length=200,
        description="litellm: a models-config name (empty: the default); anthropic: the "
        "Claude model id (empty: the provider's default)",
    )
    validators: list[str] | None = Field(
        default=None,
        description="Run only these validators (names from VALIDATORS; None: every one). "
        "The others are reported not_run ('not selected'), so the report is not complete; "
        "a selected validator that fails still ends the run validation_failed. For quick "
        "rounds while the plan is still moving, not for what ships.",
    )
    repair_rounds: int = Field(
        default=2,
        ge=0,
        le=5,
        description="Rounds of design.repair then the validators after a validator fails "
        "(0: a failure ends the run validation_failed at once)",
    )

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    @field_validator("validators")
    @classmethod
    def _validators(cls, v: list[str] | None) -> list[str] | None:
        return selected_validators(v)


class DesignInput(DesignOptions):
    """Input of ``DesignPipeline``: one decision set of one project, who asks, and the
    policy settings (see :class:`DesignOptions` for the rest)."""

    project: str = Field(pattern=_ID)
    decision_set: str = Field(pattern=_ID)
    requester: str = Field(min_length=1, max_length=256)
    # Organisation-wide knobs: never set by an API caller (a requester could otherwise
    # switch off the cost gate for their own run). None: the organisation's policy file
    # (configs/design/policy.yaml, KEEL_DESIGN_POLICY) as design.load read it; a value
    # here (a trusted starter, tests) wins over the file.
    policy: PolicySettings | None = None


class DesignAnswers(_Model):
    """Update ``answers``: values for the asked fields (``None`` withdraws a statement)."""

    answers: dict[str, Any] = Field(min_length=1)
    actor: str = Field(default="", max_length=256)
    request_id: str = Field(default="", max_length=256)


class Finding(_Model):
    """One thing a failed validator found: the validator, the file it names (if any),
    its line and what it said."""

    validator: str
    file: str | None = None
    line: int | None = None
    message: str = Field(default="", max_length=2000)


RepairFix = Literal["rule", "model", "not_fixed"]


class FindingOutcome(_Model):
    """What a repair did about one finding: fixed by a known rule (``ruff --fix``), the
    model rewrote the file it names, or neither."""

    finding: Finding
    fixed_by: RepairFix


class RepairRound(_Model):
    """One repair round as the status, the result and the ``repair`` event show it."""

    round: int
    failed: list[str] = Field(description="the validators that failed before the round")
    files_changed: list[str] = Field(default_factory=list)
    outcomes: list[FindingOutcome] = Field(default_factory=list)
    files_digest: str = Field(description="the repaired generated files")
    validation: dict[str, str] = Field(
        default_factory=dict, description="the validators after the round"
    )


class DesignStatus(_Model):
    """Query ``status`` and the reply of Update ``answers``."""

    phase: str
    node: str | None = None
    coverage: Coverage | None = None
    questions: list[Question] = Field(default_factory=list)
    question_round: int = 0
    plan_round: int = 0
    gate_id: str | None = None
    nodes_run: list[str] = Field(default_factory=list)
    repairs: list[RepairRound] = Field(
        default_factory=list, description="the repair rounds after failed validators"
    )


class DesignResult(_Model):
    """What ``DesignPipeline`` returns."""

    project: str
    decision_set: str
    status: Literal["completed", "rejected", "expired", "not_covered", "validation_failed"]
    version: int = 0
    constraints: Constraints
    coverage: Coverage
    plan: Plan | None = None
    cost: CostEstimate | None = None
    policy: PolicyReport | None = None
    gate_required: bool = False
    gate_reasons: list[str] = Field(default_factory=list)
    plan_rounds: int = 0
    rejection_comments: list[str] = Field(default_factory=list)
    files_digest: str | None = None
    file_count: int = 0
    validation_digest: str | None = None
    validation: dict[str, str] = Field(default_factory=dict)
    validated_tree_digest: str | None = Field(
        None, description="tree_digest of the tree the validators ran on (= the archive's)"
    )
    rationale_digest: str | None = None
    archive_digest: str | None = None
    git_commit: str | None = Field(
        None, description="the decision set's commit in the project's git repository"
    )
    diff: dict[str, Any] | None = None
    cost_delta_usd: float | None = None
    cost_delta_pct: float | None = None
    nodes_run: list[str] = Field(default_factory=list)
    repairs: list[RepairRound] = Field(default_factory=list)
    findings: list[Finding] = Field(
        default_factory=list,
        description="every finding of the last validation when it failed (repair rounds)",
    )


# --- activities -------------------------------------------------------------------------


class LoadInput(_Model):
    project: str
    previous_decision_set: str | None = None
    model: str = Field(default="", description="the decision set's model: is it capable?")


class PreviousState(_Model):
    """An earlier decision set as the store holds it."""

    decision_set: str
    status: str
    constraints: Constraints
    plan: dict[str, Any] | None = None
    cost: CostEstimate | None = None
    file_digests: dict[str, str] = Field(default_factory=dict)


class LoadOutput(_Model):
    """The design data (``configs/design/``) and the previous decision set, if asked."""

    catalog: PatternCatalog
    prices: PriceTable
    prompts: dict[str, str]
    prompt_pack: str
    previous: PreviousState | None = None
    # Both None in runs recorded before agents and the policy file (issue 24 §4).
    agent_model: str | None = Field(
        default=None,
        description="the decision set's model when it is capable (ModelSpec.capable): the "
        "planner and critics ask it; None: the rules decide alone",
    )
    policy: PolicySettings | None = Field(
        default=None, description="the organisation's policy file, parsed"
    )
    policy_source: str = ""


AgentKind = Literal["planner", "critic_tech", "critic_cost", "critic_security"]


class AgentInput(_Model):
    """One agent's model call (``design.agent``): the prompt file's text, the user message
    the workflow built (keel.design.agents) and the reply's JSON Schema."""

    key: str
    agent: AgentKind
    model: str
    system_prompt: str
    message: str
    json_schema: dict[str, Any]


class AgentOutput(_Model):
    """The agent's reply, validated (``reply``), or ``None`` with the problems when even
    the re-ask did not fit; the rules then decide alone for this node."""

    reply: dict[str, Any] | None = None
    problems: list[str] = Field(default_factory=list)
    reasked: bool = False
    model: str = ""
    tokens_total: int = 0
    latency_ms: int = 0


class IntakeInput(_Model):
    key: str
    text: str = Field(min_length=1)
    system_prompt: str
    model: str = ""


class IntakeOutput(_Model):
    """The intake's reading. ``snapshot.unfit`` names the fields whose value did not fit
    the schema even after the re-ask (asked as questions); ``reasked``: the first reply
    was not the schema and the model was asked once more with ``problems``."""

    snapshot: IntakeSnapshot
    model: str
    tokens_total: int = 0
    latency_ms: int = 0
    reasked: bool = False
    problems: list[str] = Field(default_factory=list)


class CodegenInput(_Model):
    key: str
    project: str
    decision_set: str
    plan: Plan
    constraints: Constraints
    rationale_md: str
    cost: CostEstimate
    policy: PolicyReport
    # Defaults keep histories recorded before providers were selectable replaying.
    codegen: CodegenProvider = "template"
    codegen_model: str = ""


class CodegenOutput(_Model):
    """The files map (``path -> text``) is stored as JSON under ``files_digest``;
    ``file_digests`` (``path -> digest``) is what the diff compares."""

    files_digest: str
    file_count: int
    file_digests: dict[str, str]


class ValidateInput(_Model):
    key: str
    files_digest: str
    extra_files: dict[str, str] = Field(
        default_factory=dict,
        description="files the workflow adds to the generated ones before validation "
        "(reports/rationale.json, reports/diff.json): the tree that ships",
    )
    ship: bool = Field(
        False,
        description="validate the tree that ships: the generated files, extra_files and "
        "the SBOM, stored as one files map (tree_files_digest) that persist archives as is",
    )
    only: list[str] | None = Field(
        None, description="the validators to run (DesignOptions.validators; None: every one)"
    )


class ValidateOutput(_Model):
    report_digest: str
    summary: dict[str, str] = Field(description="validator name -> passed|failed|not_run")
    tree_files_digest: str | None = Field(
        None, description="artifact digest of the validated tree's files map (ship=True)"
    )
    tree_digest: str | None = Field(
        None, description="keel.design.validation.tree_digest of the validated tree"
    )
    tree_file_count: int = 0

    @property
    def failed(self) -> list[str]:
        """The validators that failed."""
        return [name for name, status in self.summary.items() if status == "failed"]


class RepairInput(_Model):
    """``design.repair``: the generated files, the failed validators' report and who may
    fix: the rules always, the model ``model`` (a models-config name) when not empty."""

    key: str
    project: str
    decision_set: str
    files_digest: str
    report_digest: str
    round: int = Field(ge=0, description="the repair round; 0: the findings only")
    model: str = ""
    use_model: bool = False
    fix: bool = Field(True, description="False: read the findings, change nothing")


class RepairOutput(_Model):
    """The repaired files (a new files map, or the same digest when nothing changed)."""

    files_digest: str
    file_count: int
    file_digests: dict[str, str]
    files_changed: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    outcomes: list[FindingOutcome] = Field(default_factory=list)
    model: str = ""
    tokens_total: int = 0


class AgentRun(_Model):
    """One node's run, an ``agent_runs`` row."""

    key: str
    agent: str
    provider: str = "workflow"
    model: str = ""
    input_digest: str = ""
    output: dict[str, Any] = Field(default_factory=dict)
    tokens_total: int = 0
    latency_ms: int = 0
    ok: bool = True


class ApprovalRecord(_Model):
    gate: str
    actor: str
    status: str
    comment: str = ""


#: Event types, named as the SSE stream sends them (plan §22.3, plus the intake's own).
EVENT_COVERAGE: Final = "coverage-update"
EVENT_QUESTIONS: Final = "questions"
EVENT_ANSWERS: Final = "answers"
EVENT_PLAN: Final = "plan-ready"
EVENT_REASON_CARD: Final = "reason-card"
EVENT_COST: Final = "cost-update"
EVENT_POLICY: Final = "policy-update"
EVENT_GATE_WAITING: Final = "gate-waiting"
EVENT_APPROVAL: Final = "approval"
EVENT_ARTIFACTS: Final = "artifacts"
EVENT_VALIDATION: Final = "validation"
#: A repair round after failed validators: what was found and what changed.
EVENT_REPAIR: Final = "repair"
#: The findings of a validation that failed after the repair rounds (or with none).
EVENT_FINDINGS: Final = "validation-findings"
EVENT_DIFF: Final = "diff-update"
#: Always the last event of a finished run (written by ``design.persist`` with the version).
EVENT_RUN_COMPLETE: Final = "run-complete"
#: Not written by the workflow: a reader adds it for a run that failed or was terminated.
EVENT_RUN_ERROR: Final = "run-error"


def event_key(seq: int, type_: str) -> str:
    """An event's key: its place in the run (``seq``, from 0) and its type."""
    return f"{seq:04d}-{type_}"


def event_seq(key: str) -> int:
    """The place in the run of the event keyed ``key`` (:func:`event_key`)."""
    return int(key.split("-", 1)[0])


class DesignEvent(_Model):
    """One ``events`` row; ``key`` (:func:`event_key`) makes a replayed write land once.
    The payload carries ``project_id``, ``decision_set_id``, ``node_name`` and ``ts``
    besides the type's own fields (plan §21.6)."""

    key: str
    type: str
    payload: dict[str, Any] = Field(default_factory=dict)

    @property
    def seq(self) -> int:
        return event_seq(self.key)


class EventsSince(_Model):
    """Query ``events``: the events after place ``after`` (-1: all of them)."""

    after: int = Field(default=-1, ge=-1)


class PersistInput(_Model):
    key: str
    project: str
    owner: str
    decision_set: str
    parent: str | None = None
    status: str
    constraints: Constraints
    plan: dict[str, Any] | None = None
    summary_md: str = ""
    cost: CostEstimate | None = None
    files_digest: str | None = None
    file_digests: dict[str, str] = Field(default_factory=dict)
    report_files: dict[str, str] = Field(
        default_factory=dict, description="/reports files added to the archive (small)"
    )
    validation_digest: str | None = Field(
        None,
        description="the validators' report: its reports/*.json files go in the archive "
        "unless tree_files_digest is set",
    )
    tree_files_digest: str | None = Field(
        None,
        description="the validated tree's files map: when set, the archive is exactly it "
        "(files_digest, report_files and the report's files are not added)",
    )
    agent_runs: list[AgentRun] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    events: list[DesignEvent] = Field(default_factory=list)


class PersistOutput(_Model):
    version: int
    archive_digest: str | None = None
    inserted_events: int = 0
    completed: DesignEvent | None = Field(
        None, description="the run-complete event written last, with the version"
    )
    git_commit: str | None = Field(
        None, description="the decision set's commit in the project's git repository"
    )


#: Reads configs/design (patterns, prices, prompts) and the previous decision set.
LOAD: ActivityRef[LoadInput, LoadOutput] = ActivityRef("design.load", LoadInput, LoadOutput)
#: Free text to the Constraint Schema through the LLM gateway, validated in the activity.
INTAKE_EXTRACT: ActivityRef[IntakeInput, IntakeOutput] = ActivityRef(
    "design.intake_extract", IntakeInput, IntakeOutput
)
#: A planner or critic agent's model call, schema-constrained, re-asked once (issue 24 §4).
AGENT: ActivityRef[AgentInput, AgentOutput] = ActivityRef("design.agent", AgentInput, AgentOutput)
#: The repository from the plan (activities/design/codegen.py ``render_request``).
CODEGEN: ActivityRef[CodegenInput, CodegenOutput] = ActivityRef(
    "design.codegen", CodegenInput, CodegenOutput
)
#: The validators on the generated repository (activities/design/validators/).
VALIDATE: ActivityRef[ValidateInput, ValidateOutput] = ActivityRef(
    "design.validate", ValidateInput, ValidateOutput
)
#: Fixes for the failed validators' findings: known rules, then the codegen model.
REPAIR: ActivityRef[RepairInput, RepairOutput] = ActivityRef(
    "design.repair", RepairInput, RepairOutput
)
#: SQL rows of the decision set and the archive of its repository, idempotent by key.
PERSIST: ActivityRef[PersistInput, PersistOutput] = ActivityRef(
    "design.persist", PersistInput, PersistOutput
)
