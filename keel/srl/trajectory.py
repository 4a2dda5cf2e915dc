"""The trajectory records of SRL episodes: the plan's §7 JSONL step and its SQL row.

A step is identified by ``(task_id, sample, step)``; :func:`step_key` turns that into the
idempotency key the store uses as its primary key, so a step appended twice (a retried
activity, a replayed workflow after a worker was killed, a collection run again) is one
row. An episode's workflow id is :func:`episode_id`, ``srl/<collection>/<task_id>``
(``~s<k>`` appended for sample ``k`` >= 1; ``~`` is never in an id, so the two can't
meet). Each sample has its own seed, :func:`sample_seed`.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keel.digest import canonical_json, digest_bytes, digest_json
from keel.ids import ID_RE
from keel.srl.rewards import Reward

SCHEMA_VERSION: Final = 1
EPISODE_PREFIX = "srl/"
SAMPLE_MARK = "~s"
#: The largest seed a sample gets: step ``n`` sends ``seed + n``, within 31 bits.
MAX_SAMPLE_SEED: Final = 2**31 - 1 - 64

Source = Literal["teacher", "actor", "gold_replay"]
#: Where step ``n`` starts (docs/srl-collect.md, "Step modes"): ``expert_prefix`` (the
#: paper's: from the file after the expert's steps ``1..n-1``, which the state shows) or
#: ``free_running`` (from the file the episode's own previous step left).
StepMode = Literal["expert_prefix", "free_running"]


def check_id(value: str, what: str) -> str:
    """Collection and task ids: 1-128 chars of ``[A-Za-z0-9._-]``, so they can sit in a
    workflow id, a file name and a key without quoting."""
    if not ID_RE.match(value):
        raise ValueError(f"{what} {value!r} must be 1-128 chars of [A-Za-z0-9._-]")
    return value


def _sample_suffix(sample: int) -> str:
    if sample < 0:
        raise ValueError(f"sample must be >= 0, got {sample}")
    return f"{SAMPLE_MARK}{sample}" if sample else ""


def episode_id(collection: str, task_id: str, sample: int = 0) -> str:
    """``srl/<collection>/<task_id>`` (sample 0) or ``srl/<collection>/<task_id>~s<k>``:
    the ``SRLEpisode`` workflow id."""
    return (
        f"{EPISODE_PREFIX}{check_id(collection, 'collection')}/"
        f"{check_id(task_id, 'task id')}{_sample_suffix(sample)}"
    )


def parse_episode_sample(value: str) -> tuple[str, str, int]:
    """``(collection, task_id, sample)`` of an episode id; ``ValueError`` when it is not one."""
    parts = value.split("/")
    if len(parts) != 3 or parts[0] != "srl":
        raise ValueError(f"{value!r} is not srl/<collection>/<task_id>")
    task, mark, sample = parts[2].partition(SAMPLE_MARK)
    if mark and not (sample.isdigit() and sample == str(int(sample)) and int(sample) >= 1):
        raise ValueError(f"{value!r}: {mark}{sample} is not a sample index >= 1")
    return check_id(parts[1], "collection"), check_id(task, "task id"), int(sample or 0)


def step_key(task_id: str, step: int, sample: int = 0) -> str:
    """The idempotency key of a step: ``<task_id>#<step>`` (step is 1-based), or
    ``<task_id>~s<k>#<step>`` for sample ``k`` >= 1."""
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    return f"{check_id(task_id, 'task id')}{_sample_suffix(sample)}#{step}"


def sample_seed(collection: str, task_id: str, sample: int, base: int = 0) -> int:
    """The seed of one sample of one task: BLAKE3 of (collection, task, sample, base seed),
    in ``0..MAX_SAMPLE_SEED``. The same on every run, so a re-run sends what the first did;
    different per sample, so K samples are K draws."""
    digest = digest_json(
        {"collection": collection, "task_id": task_id, "sample": sample, "base": base}
    )
    return int(digest.removeprefix("blake3:")[:16], 16) % (MAX_SAMPLE_SEED + 1)


class Sampling(BaseModel):
    """How a step's answer was drawn: the sample index, the seed sent, and the sampling
    parameters (what a re-run must match to reuse it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample: int = Field(default=0, ge=0)
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None


class ModelOutput(BaseModel):
    """What the model answered: the parsed parts, or the format error and the raw text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    think: str = ""
    action: dict[str, Any] | None = None
    state_update: dict[str, Any] | None = None
    raw: str = ""
    format_error: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    endpoint: str | None = Field(None, description="the actor that answered (actor mode)")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    latency_s: float | None = None
    cost_usd: float | None = None
    #: The server decoded against the step's JSON Schema (the answer's JSON form).
    structured: bool = False


class StepRecord(BaseModel):
    """One line of ``trajectories/raw/*.jsonl`` (plan §7), with a schema version.

    ``prompt``, ``state_before`` and ``sandbox_result`` stay open mappings here; their
    producers (the prompt renderer, :class:`keel.srl.state.State`, the sandbox activity)
    own their shapes. ``reward`` is ``None`` until the step is scored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    task_id: str
    step: int = Field(ge=1)
    prompt: dict[str, Any]
    state_before: dict[str, Any]
    model_output: ModelOutput
    sandbox_result: dict[str, Any] | None = None
    reward: Reward | None = None
    state_after: dict[str, Any] | None = None
    text_digest: str | None = Field(None, description="the file after the step (artifact)")
    sampling: Sampling | None = Field(None, description="sample, seed, sampling parameters")
    # What the rewards were computed from, so that both (``reward.total`` and
    # ``reward.paper_reward``) can be recomputed from the record alone
    # (``keel.srl.rewards.combine``; the replaced regions are in ``sandbox_result``).
    # ``None`` in records written before they were kept.
    expert_action: dict[str, Any] | None = Field(
        None, description="the expert's action the step was compared with"
    )
    expert_text_after: str | None = Field(None, description="the file after the expert's step")
    text_before: str | None = Field(None, description="the file before the step")
    text_after: str | None = Field(
        None, description="the file after the step (the action's result; unchanged if none)"
    )
    step_mode: StepMode | None = Field(
        None,
        description="where the step started: expert_prefix (the file after the expert's "
        "steps 1..n-1) or free_running (the episode's own last file); None: recorded before "
        "step modes, free running",
    )
    expert_feedback_in_prompt: bool | None = Field(
        None,
        description="the feedback this step wrote into the state (shown in the next prompt) "
        "was derived from the expert's file ('matches the goal', 'removed code the goal "
        "keeps'); None: recorded before this was kept (it was)",
    )

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, value: str) -> str:
        return check_id(value, "task id")

    @property
    def sample(self) -> int:
        return self.sampling.sample if self.sampling else 0

    @property
    def key(self) -> str:
        return step_key(self.task_id, self.step, self.sample)

    def to_jsonl(self) -> str:
        """One canonical JSON line (sorted keys, no spaces), without the newline."""
        return canonical_json(self).decode("utf-8")

    @classmethod
    def from_jsonl(cls, line: str) -> StepRecord:
        return cls.model_validate_json(line)


class StepRow(BaseModel):
    """The SQL row of one step: flat columns for reports and export, the record as JSON.

    ``(collection, step_key)`` is the primary key (see :func:`step_key`); ``record_digest`` lets a
    second insert of the same key be told apart from a conflicting one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_key: str
    schema_version: int
    collection: str
    task_id: str
    step: int
    source: Source
    model: str
    language: str
    template: str | None
    format_ok: bool
    verified: bool | None
    tests_passed: float | None
    diff_lines: int | None
    step_similarity: float | None
    reward_total: float | None
    record_json: str
    record_digest: str
    sample: int = 0
    seed: int | None = None

    @classmethod
    def from_record(
        cls,
        record: StepRecord,
        *,
        collection: str,
        source: Source,
        model: str,
        language: str,
        template: str | None = None,
    ) -> StepRow:
        reward = record.reward
        body = canonical_json(record)
        return cls(
            step_key=record.key,
            schema_version=record.schema_version,
            collection=check_id(collection, "collection"),
            task_id=record.task_id,
            step=record.step,
            source=source,
            model=model,
            language=language,
            template=template,
            format_ok=record.model_output.format_error is None,
            verified=reward.verified if reward else None,
            tests_passed=reward.tests_passed if reward else None,
            diff_lines=(reward.diff_added + reward.diff_removed) if reward else None,
            step_similarity=reward.step_similarity if reward else None,
            reward_total=reward.total if reward else None,
            record_json=body.decode("utf-8"),
            record_digest=digest_bytes(body),
            sample=record.sample,
            seed=record.sampling.seed if record.sampling else None,
        )


class PrecisionLine(BaseModel):
    """Verified over scored steps for one (source, model, language, template)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source
    model: str
    language: str
    template: str
    verified: int
    total: int

    @property
    def precision(self) -> float:
        return self.verified / self.total if self.total else 0.0


def precision_lines(rows: list[StepRow]) -> list[PrecisionLine]:
    """Group scored rows by source, model, language and template (``-`` when none).

    Rows are grouped by ``source`` first, so a gold-action replay is never counted as
    a model's precision. A malformed answer counts as an unverified step; a row not yet
    scored (``verified`` is ``None``) and well-formed is left out.
    """
    counts: dict[tuple[Source, str, str, str], list[int]] = {}
    for row in rows:
        if row.verified is None and row.format_ok:
            continue
        key = (row.source, row.model, row.language, row.template or "-")
        tally = counts.setdefault(key, [0, 0])
        tally[0] += 1 if row.verified else 0
        tally[1] += 1
    return [
        PrecisionLine(source=s, model=m, language=lang, template=t, verified=v, total=total)
        for (s, m, lang, t), (v, total) in sorted(counts.items())
    ]


def precision_report(rows: list[StepRow], title: str = "Teacher precision") -> str:
    """Markdown table of :func:`precision_lines`, one line per group, and totals per source."""
    lines = precision_lines(rows)
    out = [
        f"# {title}",
        "",
        "| source | model | language | template | verified | total | precision |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for p in lines:
        out.append(
            f"| {p.source} | {p.model} | {p.language} | {p.template} | {p.verified} "
            f"| {p.total} | {p.precision:.1%} |"
        )
    out.append("")
    for source in sorted({p.source for p in lines}):
        verified = sum(p.verified for p in lines if p.source == source)
        total = sum(p.total for p in lines if p.source == source)
        out.append(f"- {source}: {verified} / {total} verified")
    return "\n".join(out) + "\n"
