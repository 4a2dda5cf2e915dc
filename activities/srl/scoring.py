"""Scoring an SRL step: ``srl.apply``'s sandbox run, re-parse, task tests and reward.

The action runs in the jail on the task's file, the result is re-parsed in the task's
language, the task's tests run on it, and ``keel.srl.rewards`` scores it; the step's
record and the outcome it implies follow. :class:`StepScoring` is a part of
``activities.srl.episode.SrlActivities``, which binds the store and the sandbox.
"""

from __future__ import annotations

import asyncio
from typing import Any

from activities.srl.checks import run_task_tests
from activities.srl.data import python_syntax_error
from activities.srl.jail import JailRuns, OneRunEach
from keel.srl.errors import StepFormatError
from keel.srl.rewards import combine, format_error_reward
from keel.srl.state import State, StateUpdate, merge
from keel.srl.step import PatternAction, RuleAction, parse_step
from keel.srl.steps import ApplyInput, Generation, SrlTask, StepOutcome
from keel.srl.trajectory import ModelOutput, Sampling, StepRecord, step_key
from sandbox import AstGrepAction, SandboxConfig, SandboxError, SandboxLimits
from sandbox.astgrep import AstGrepResult
from store.artifacts import ArtifactStore, GroupedPuts


class StepScoring:
    """The scoring half of ``SrlActivities``: needs its artifact store and sandbox."""

    artifacts: ArtifactStore
    puts: GroupedPuts
    sandbox_config: SandboxConfig | None
    sandbox_limits: SandboxLimits | None

    async def _score(
        self,
        task: SrlTask,
        inp: ApplyInput,
        text: str,
        text_digest: str | None = None,
        jail: JailRuns | None = None,
    ) -> tuple[StepRecord, StepOutcome]:
        """Score the step on ``text`` (the file it started from, ``text_digest`` in the
        artifact store, ``None`` for the task's ``pre``); ``jail`` makes its jail runs
        (by default one run per call; a batch of episodes groups them)."""
        jail = jail or OneRunEach(self.sandbox_limits, self.sandbox_config)
        gen = inp.generation
        state = inp.state
        key = step_key(task.task_id, inp.step, inp.sample)
        expert, expert_post = task.expert_at(inp.step)
        base = await self._record_base(task, inp, text)
        try:
            step = parse_step(gen.raw, finish_reason=gen.finish_reason)
        except StepFormatError as e:
            feedback = f"step {inp.step}: malformed answer ({e.kind})"
            after = merge(state, StateUpdate(history=[feedback]))
            record = StepRecord(
                **base,
                model_output=_output(gen, format_error=f"{e.kind}: {e.detail}"),
                reward=format_error_reward(),
                state_after=after.model_dump(mode="json"),
                text_digest=text_digest,
                text_after=text,
            )
            return record, _outcome_of(record, key, task)
        result, tests_passed = await self._sandbox_and_tests(task, step.action, text, jail)
        result_text: str | None = result["text"]
        reward = combine(
            action=step.action,
            expert=expert,
            pre=text,
            result_text=result_text,
            gold_post=expert_post,
            final_post=task.post,
            reparses=result["reparses"],
            language=task.language,
            replaced=[(a, b) for a, b in result.get("replaced") or []],
            tests_passed=tests_passed,
        )
        changed = result_text is not None and result_text != text
        if changed and result_text is not None:
            text_digest = await self.puts.put_bytes(result_text.encode("utf-8"))
        feedback = _feedback(
            inp.step, result, changed, reward.verified, reward.effect, expert=inp.expert_feedback
        )
        after = merge(merge(state, step.state_update), StateUpdate(history=[feedback]))
        record = StepRecord(
            **base,
            model_output=_output(
                gen, think=step.think, action=step.action, update=step.state_update
            ),
            sandbox_result={k: v for k, v in result.items() if k != "text"},
            reward=reward,
            state_after=after.model_dump(mode="json"),
            text_digest=text_digest,
            text_after=result_text if changed else text,
        )
        return record, _outcome_of(record, key, task)

    async def _record_base(self, task: SrlTask, inp: ApplyInput, text: str) -> dict[str, Any]:
        """The step record's fields that do not depend on the answer."""
        gen = inp.generation
        expert, expert_post = task.expert_at(inp.step)
        mode = task.step_mode(inp.step_mode)
        return {
            "task_id": task.task_id,
            "step": inp.step,
            "prompt": await asyncio.to_thread(self.artifacts.get_json, gen.prompt_digest),
            "state_before": inp.state.model_dump(mode="json"),
            "sampling": gen.sampling or (Sampling(sample=inp.sample) if inp.sample else None),
            "expert_action": expert.model_dump(mode="json") if expert is not None else None,
            "expert_text_after": expert_post,
            "text_before": text,
            "step_mode": mode,
            # Only a free-running episode's next prompt shows the state this step writes.
            "expert_feedback_in_prompt": inp.expert_feedback and mode == "free_running",
        }

    async def _sandbox_and_tests(
        self, task: SrlTask, action: PatternAction | RuleAction, text: str, jail: JailRuns
    ) -> tuple[dict[str, Any], float | None]:
        """:meth:`_sandbox`'s result with the report of the task's tests, run on the file
        after the action (unchanged where it failed), and the fraction that passed."""
        result = await self._sandbox(task, action, text, jail)
        result_text: str | None = result["text"]
        tests_passed, tests_report = await run_task_tests(
            task.tests,
            result_text if result_text is not None else text,
            task.file_name,
            limits=self.sandbox_limits,
            config=self.sandbox_config,
        )
        result.update(tests_report)
        return result, tests_passed

    async def _sandbox(
        self, task: SrlTask, action: PatternAction | RuleAction, text: str, jail: JailRuns
    ) -> dict[str, Any]:
        """Apply ``action`` to the task's file in the jail and re-parse the result in the
        task's language (never the one the action claims).

        A bad action, a timeout or a crash of ast-grep is a result (the model's mistake,
        recorded); so is an action in another language than the task's, which is not
        applied. A jail that cannot start raises, so the activity is retried.
        """
        name = task.file_name
        if action.language != task.language:
            return _sandbox_result(
                ok=False,
                error=f"not applied: the action's language is {action.language}, "
                f"the task's is {task.language}",
            )
        sg = _astgrep_action(action)
        try:
            applied = await jail.apply(sg, name, text)
        except SandboxError as e:  # refused request (e.g. a path): the action's fault
            return _sandbox_result(ok=False, error=str(e))
        facts = await self._run_facts(applied)
        if not applied.ok:
            return _sandbox_result(ok=False, error=applied.error, **facts)
        result_text = applied.changed_files.get(name, text)
        reparses, parse_errors = await self._reparse(task, result_text, jail)
        replaced: list[tuple[int, int]] | None = None
        if result_text != text:
            # Where the rewrite replaced code: a region spanning the whole file is an
            # overwrite (keel.srl.rewards.is_overwrite), never an equivalent action.
            spans = await jail.spans(sg, name, text)
            replaced = spans.spans.get(name, []) if spans.ok else None
        return {
            **_sandbox_result(ok=True, **facts),
            "text": result_text,
            "reparses": reparses,
            "parse_errors": parse_errors[:5],
            "replaced": [list(r) for r in replaced] if replaced is not None else None,
        }

    async def _run_facts(self, applied: AstGrepResult) -> dict[str, Any]:
        """What the jail's run of the action reports: its diff and stderr (kept in the
        artifact store), exit, time and the limit that stopped it."""
        diff_digest = None
        if applied.diff or applied.run.stderr:
            diff_digest = await self.puts.put_json(
                {"diff": applied.diff, "stderr": applied.run.stderr[-20_000:]}
            )
        run = applied.run
        facts: dict[str, Any] = {
            "timed_out": run.timed_out,
            "exit_code": run.exit_code,
            "duration_ms": run.duration_ms,
            "artifact": diff_digest,
        }
        if run.limit is not None:  # which limit stopped the action (wall, cpu, memory, output)
            facts["limit"] = run.limit
        return facts

    async def _reparse(self, task: SrlTask, text: str, jail: JailRuns) -> tuple[bool, list[str]]:
        """Whether ``text`` parses in the task's language (ast-grep in the jail, Python
        also CPython's parser), and the parse errors."""
        name = task.file_name
        check = await jail.parses(name, text, task.language)
        parse_errors = check.errors.get(name, []) if check.ok else [check.error or "check failed"]
        if check.ok and not parse_errors and task.language == "python":
            parse_errors = _python_parse_errors(text)
        return check.ok and not parse_errors, parse_errors


def _astgrep_action(action: PatternAction | RuleAction) -> AstGrepAction:
    """The model's action as ast-grep runs it: a YAML rule, or a pattern and rewrite."""
    if isinstance(action, RuleAction):
        return AstGrepAction(rule=action.yaml_text)
    return AstGrepAction(pattern=action.pattern, rewrite=action.rewrite, language=action.language)


def _sandbox_result(*, ok: bool, error: str | None = None, **facts: Any) -> dict[str, Any]:
    return {"ok": ok, "error": error, "text": None, "reparses": False, "parse_errors": [], **facts}


def _python_parse_errors(text: str) -> list[str]:
    # Tree-sitter's zero-width MISSING nodes escape the ast-grep rule; CPython's parser
    # catches them.
    error = python_syntax_error(text)
    return [f"python: {error}"[:200]] if error else []


def _feedback(
    step: int,
    result: dict[str, Any],
    changed: bool,
    verified: bool,
    effect: str | None = None,
    *,
    expert: bool = True,
) -> str:
    """The history line a step adds to the state. What the jail saw (failed, an overwrite,
    unchanged, does not parse) always; what only a comparison with the expert's file tells
    (matches the goal, removed code the goal keeps, does not match yet) only when
    ``expert`` is set: otherwise "the file changed"."""
    if not result["ok"]:
        return f"step {step}: the action failed: {(result['error'] or '')[:180]}"
    if effect == "overwrite":
        return f"step {step}: applied but it rewrote the whole file, not the code to change"
    if not expert and changed and result["reparses"]:
        return f"step {step}: applied; the file changed"
    if verified:
        return f"step {step}: applied; the file now matches the goal"
    if not changed:
        return f"step {step}: applied but matched nothing; the file is unchanged"
    if not result["reparses"]:
        return f"step {step}: applied but the result does not parse"
    if effect == "destructive":
        return f"step {step}: applied but it removed code the goal keeps"
    return f"step {step}: applied; the file changed but does not match the goal yet"


def _output(
    gen: Generation,
    *,
    think: str = "",
    action: PatternAction | RuleAction | None = None,
    update: StateUpdate | None = None,
    format_error: str | None = None,
) -> ModelOutput:
    return ModelOutput(
        think=think,
        action=action.model_dump(mode="json") if action is not None else None,
        state_update=update.model_dump(mode="json", exclude_defaults=True) if update else None,
        raw=gen.raw,
        format_error=format_error,
        token_ids=gen.token_ids,
        logprobs=gen.logprobs,
        endpoint=gen.endpoint or None,
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=gen.completion_tokens,
        finish_reason=gen.finish_reason,
        latency_s=gen.latency_s or None,
        cost_usd=gen.cost_usd,
        structured=gen.structured,
    )


def _outcome_of(record: StepRecord, key: str, task: SrlTask) -> StepOutcome:
    """The outcome a step's record implies (also for a row read back on a retry).

    A free-running episode is done when a step is verified; an ``expert_prefix`` one after
    the expert's number of steps (each step starts from the expert's prefix, whatever the
    model's last step did)."""
    reward = record.reward
    sandbox = record.sandbox_result or {}
    verified = bool(reward and reward.verified)
    if record.step_mode == "expert_prefix":
        done = record.step >= task.expert_step_count
    else:
        done = verified
    return StepOutcome(
        step_key=key,
        format_ok=record.model_output.format_error is None,
        applied=bool(sandbox.get("ok")),
        verified=verified,
        reward_total=reward.total if reward else 0.0,
        state=State.model_validate(record.state_after or record.state_before),
        text_digest=record.text_digest,
        done=done,
        recorded=True,
        sandbox_failed=bool(sandbox) and not sandbox.get("ok"),
    )
