"""How a step's jail runs are made: one run per call (:class:`OneRunEach`, an episode's
``srl.apply``), or the calls of many steps grouped into shared runs (:class:`GroupedRuns`,
a batch of episodes in ``srl.episodes``).

A step runs ast-grep in the jail three times: the action, the re-parse of the result, the
regions the action replaces. Each run is a jail started and torn down (about 15 ms of CPU
on the 2-core machine), so a collection of thousands of steps spends most of its CPU
there. :class:`GroupedRuns` collects the calls made within ``delay_s`` of each other and
runs each group once, every step's file in a folder of its own (``<k>/<file>``): the
actions of one pattern, rewrite and language together; re-parses of one language
together. What each step gets back is its own file's: its text after, its diff, its
parse errors, its spans. The run's facts (exit, time, stderr) are the shared run's. A
group whose run fails is run again one call at a time, so a step never fails for
another's file. Rule actions (``--rule``, whose ``files:`` globs could read the folders)
are never grouped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from sandbox import AstGrepAction, AstGrepResult, ParseCheck, SandboxConfig, SandboxLimits
from sandbox.astgrep import (
    AstGrepSpans,
    apply_astgrep_async,
    astgrep_spans_async,
    check_parses_async,
    unified_diff,
)

#: How long a group waits for more calls after its first, and its most calls.
GROUP_DELAY_S = 0.05
GROUP_MAX = 64


class JailRuns(Protocol):
    """The three jail runs of a step, on one file ``name``."""

    async def apply(self, action: AstGrepAction, name: str, text: str) -> AstGrepResult: ...

    async def parses(self, name: str, text: str, language: str) -> ParseCheck: ...

    async def spans(self, action: AstGrepAction, name: str, text: str) -> AstGrepSpans: ...


class OneRunEach:
    """A jail run per call."""

    def __init__(self, limits: SandboxLimits | None, config: SandboxConfig | None) -> None:
        self.limits = limits
        self.config = config

    async def apply(self, action: AstGrepAction, name: str, text: str) -> AstGrepResult:
        return await apply_astgrep_async(
            action, {name: text}, limits=self.limits, config=self.config
        )

    async def parses(self, name: str, text: str, language: str) -> ParseCheck:
        return await check_parses_async(
            {name: text}, language, limits=self.limits, config=self.config
        )

    async def spans(self, action: AstGrepAction, name: str, text: str) -> AstGrepSpans:
        return await astgrep_spans_async(
            action, {name: text}, limits=self.limits, config=self.config
        )


_Call = tuple[str, str, "asyncio.Future[Any]"]  # (name, text, the caller's answer)


class GroupedRuns:
    """Calls within ``delay_s`` of each other with the same action (or language) share a
    jail run; see the module docstring. ``runs`` counts the jail runs made."""

    def __init__(
        self,
        limits: SandboxLimits | None,
        config: SandboxConfig | None,
        *,
        delay_s: float = GROUP_DELAY_S,
        most: int = GROUP_MAX,
    ) -> None:
        self.limits = limits
        self.config = config
        self._one = OneRunEach(limits, config)
        self.delay_s = delay_s
        self.most = most
        self.runs = 0
        self._groups: dict[tuple[str, str], list[_Call]] = {}
        self._flushing: set[asyncio.Task[None]] = set()

    async def apply(self, action: AstGrepAction, name: str, text: str) -> AstGrepResult:
        if action.rule is not None or action.paths is not None:
            self.runs += 1
            return await self._one.apply(action, name, text)
        result: AstGrepResult = await self._join(
            ("apply", action.model_dump_json()), name, text, lambda c: self._apply(action, c)
        )
        return result

    async def parses(self, name: str, text: str, language: str) -> ParseCheck:
        result: ParseCheck = await self._join(
            ("parses", language), name, text, lambda c: self._parses(language, c)
        )
        return result

    async def spans(self, action: AstGrepAction, name: str, text: str) -> AstGrepSpans:
        if action.rule is not None or action.paths is not None:
            self.runs += 1
            return await self._one.spans(action, name, text)
        result: AstGrepSpans = await self._join(
            ("spans", action.model_dump_json()), name, text, lambda c: self._spans(action, c)
        )
        return result

    # -- grouping ------------------------------------------------------------------------
    async def _join(
        self,
        key: tuple[str, str],
        name: str,
        text: str,
        run: Callable[[list[_Call]], Coroutine[Any, Any, None]],
    ) -> Any:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        group = self._groups.setdefault(key, [])
        group.append((name, text, answer))
        if len(group) >= self.most:
            self._start(self._groups.pop(key), run)
        elif len(group) == 1:
            loop.call_later(self.delay_s, self._due, key, group, run)
        return await answer

    def _due(
        self,
        key: tuple[str, str],
        group: list[_Call],
        run: Callable[[list[_Call]], Coroutine[Any, Any, None]],
    ) -> None:
        if self._groups.get(key) is group:  # not already started full
            self._start(self._groups.pop(key), run)

    def _start(
        self, calls: list[_Call], run: Callable[[list[_Call]], Coroutine[Any, Any, None]]
    ) -> None:
        async def guarded() -> None:
            try:
                await run(calls)
            except BaseException as e:  # the callers raise what the run raised
                for _, _, answer in calls:
                    if not answer.done():
                        answer.set_exception(e)
                if not isinstance(e, Exception):
                    raise

        task = asyncio.get_running_loop().create_task(guarded())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    @staticmethod
    def _files(calls: list[_Call]) -> dict[str, str]:
        return {f"{k}/{name}": text for k, (name, text, _) in enumerate(calls)}

    async def _one_at_a_time(
        self, calls: list[_Call], each: Callable[[str, str], Coroutine[Any, Any, Any]]
    ) -> None:
        for name, text, answer in calls:
            self.runs += 1
            try:
                answer.set_result(await each(name, text))
            except Exception as e:
                answer.set_exception(e)

    async def _apply(self, action: AstGrepAction, calls: list[_Call]) -> None:
        if len(calls) == 1:
            return await self._one_at_a_time(calls, lambda n, t: self._one.apply(action, n, t))
        files = self._files(calls)
        self.runs += 1
        shared = await apply_astgrep_async(action, files, limits=self.limits, config=self.config)
        if not shared.ok:
            return await self._one_at_a_time(calls, lambda n, t: self._one.apply(action, n, t))
        for k, (name, text, answer) in enumerate(calls):
            after = shared.changed_files.get(f"{k}/{name}")
            changed = {name: after} if after is not None else {}
            answer.set_result(
                AstGrepResult(
                    ok=True,
                    changed_files=changed,
                    diff=unified_diff({name: text}, changed) if changed else "",
                    run=shared.run,
                )
            )

    async def _parses(self, language: str, calls: list[_Call]) -> None:
        if len(calls) == 1:
            return await self._one_at_a_time(calls, lambda n, t: self._one.parses(n, t, language))
        self.runs += 1
        shared = await check_parses_async(
            self._files(calls), language, limits=self.limits, config=self.config
        )
        if not shared.ok:
            return await self._one_at_a_time(calls, lambda n, t: self._one.parses(n, t, language))
        for k, (name, _, answer) in enumerate(calls):
            errors = shared.errors.get(f"{k}/{name}", [])
            answer.set_result(ParseCheck(ok=True, errors={name: errors}, run=shared.run))

    async def _spans(self, action: AstGrepAction, calls: list[_Call]) -> None:
        if len(calls) == 1:
            return await self._one_at_a_time(calls, lambda n, t: self._one.spans(action, n, t))
        self.runs += 1
        shared = await astgrep_spans_async(
            action, self._files(calls), limits=self.limits, config=self.config
        )
        if not shared.ok:
            return await self._one_at_a_time(calls, lambda n, t: self._one.spans(action, n, t))
        for k, (name, _, answer) in enumerate(calls):
            spans = shared.spans.get(f"{k}/{name}", [])
            answer.set_result(AstGrepSpans(ok=True, spans={name: spans}, run=shared.run))
