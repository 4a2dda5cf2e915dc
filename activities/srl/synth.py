"""``srl synth``: synthetic ast-grep tasks over real, licensed source files, each gold
action verified with real ast-grep in the jail (docs/srl-data.md).

Sources are files that ship in installed registry packages, each with a licence that
can be stated: the Python standard library's own sources (PSF-2.0), and JavaScript,
TypeScript and Java files inside installed PyPI distributions whose metadata declares a
permissive licence. ``keel.srl.synth.synthesise`` makes the tasks; a task is kept only
when its gold action, run by ast-grep in the sandbox, yields exactly the expected
post-text and that text re-parses (ast-grep's parser in the jail; Python also
``ast.parse``). Every refusal is counted per template and reason.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import re
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from activities.srl.data import PARSE_BATCH, PARSE_EXTENSIONS, astgrep_parses, python_parses
from keel.srl.step import Language
from keel.srl.synth import SourceFile, SynthTask, synthesise

# Licences a task may carry: permissive, so a derived task can be redistributed.
PERMISSIVE = frozenset(
    {"MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "ISC", "PSF-2.0", "0BSD", "Unlicense"}
)
# Free-text ``License:`` values seen in package metadata, as SPDX ids.
_LICENSE_ALIASES = {
    "mit": "MIT",
    "mit license": "MIT",
    "the mit license": "MIT",
    "apache-2.0": "Apache-2.0",
    "apache 2.0": "Apache-2.0",
    "apache license 2.0": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0",
    "apache software license 2.0": "Apache-2.0",
    "bsd-3-clause": "BSD-3-Clause",
    "bsd 3-clause": "BSD-3-Clause",
    "bsd-2-clause": "BSD-2-Clause",
    "isc": "ISC",
    "isc license": "ISC",
}
_CLASSIFIERS = {
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: ISC License (ISCL)": "ISC",
    "License :: OSI Approved :: Apache Software License": "Apache-2.0",
}
SOURCE_EXTENSIONS: dict[str, Language] = {
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".java": "java",
}
MAX_SOURCE_BYTES = 64_000
# Files per synthesise call and tasks per verification round.
SOURCE_CHUNK = 24
VERIFY_CONCURRENCY = 2
_FOREIGN_LICENSE = re.compile(
    r"@license|\bGPL\b|Mozilla Public License|\bMPL\b|SPDX-License-Identifier"
)
_STDLIB_SKIP = ("test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__")


class SynthOutcome(BaseModel):
    """Verified tasks and the account of everything that was not kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[SynthTask]
    verified_by_language: dict[str, int]
    candidates: int = Field(description="tasks synthesise made and the jail checked")
    refused: dict[str, dict[str, int]] = Field(
        description="template -> reason -> count: not_applicable (the template refused the "
        "file), apply_error, no_match, post_mismatch, reparse_failed, ast_parse_failed"
    )
    sources: int
    sources_by_package: dict[str, int]
    jail_runs: int
    seconds: float
    seconds_per_jail_run: float
    notes: list[str] = Field(default_factory=list)


# ---- sources -------------------------------------------------------------------------


def stdlib_sources(max_files: int | None = None) -> Iterator[SourceFile]:
    """The standard library's own ``.py`` files (PSF-2.0), test suites left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    package = f"cpython-{sys.version_info.major}.{sys.version_info.minor}-stdlib"
    count = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _STDLIB_SKIP for part in rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if len(data) > MAX_SOURCE_BYTES:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        yield SourceFile(
            path=f"Lib/{rel.as_posix()}",
            text=text,
            license="PSF-2.0",
            language="python",
            package=package,
        )
        count += 1
        if max_files is not None and count >= max_files:
            return


def _field(dist: md.Distribution, name: str) -> str:
    # PackageMetadata promises get_all, not get; a missing field is None either way.
    values = dist.metadata.get_all(name)
    return str(values[0]) if values else ""


def distribution_license(dist: md.Distribution) -> tuple[str | None, str]:
    """The SPDX id a distribution's metadata states, and where it was read; ``None``
    when it states none or something that is not one permissive id."""
    expression = _field(dist, "License-Expression").strip()
    if expression:
        return (
            expression if expression in PERMISSIVE else None
        ), f"License-Expression: {expression}"
    free = _field(dist, "License").strip()
    if free and "\n" not in free and free.lower() in _LICENSE_ALIASES:
        return _LICENSE_ALIASES[free.lower()], f"License: {free}"
    for classifier in dist.metadata.get_all("Classifier") or []:
        if classifier in _CLASSIFIERS:
            return _CLASSIFIERS[classifier], f"Classifier: {classifier}"
    return None, f"License: {free[:60]!r}" if free else "no licence metadata"


def _plain_source(text: str) -> bool:
    """Hand-written, not a minified bundle, and carrying no licence header of its own
    (a vendored file may be under another licence than its package)."""
    lines = text.splitlines()
    if not lines or max(len(line) for line in lines) > 400:
        return False
    return not _FOREIGN_LICENSE.search(text[:4000])


def package_sources(languages: Iterable[str], max_files: int | None = None) -> Iterator[SourceFile]:
    """JavaScript, TypeScript and Java files shipped inside installed distributions
    whose metadata states a permissive licence; sorted by package and path."""
    wanted = set(languages)
    dists = sorted(md.distributions(), key=lambda d: _field(d, "Name").lower())
    count = 0
    for dist in dists:
        files = [
            f for f in (dist.files or []) if SOURCE_EXTENSIONS.get(Path(str(f)).suffix) in wanted
        ]
        if not files:
            continue
        spdx, _ = distribution_license(dist)
        if spdx is None:
            continue
        name = _field(dist, "Name") or "unknown"
        version = dist.version
        for rel in sorted(files, key=str):
            if str(rel).endswith((".d.ts", ".min.js")):
                continue
            path = Path(str(dist.locate_file(rel)))
            try:
                data = path.read_bytes()
                text = data.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(data) > MAX_SOURCE_BYTES or not _plain_source(text):
                continue
            yield SourceFile(
                path=str(rel),
                text=text,
                license=spdx,
                language=SOURCE_EXTENSIONS[Path(str(rel)).suffix],
                package=f"{name}=={version}",
            )
            count += 1
            if max_files is not None and count >= max_files:
                return


def collect_sources(languages: Sequence[str]) -> dict[str, Iterator[SourceFile]]:
    """One lazy stream of sources per language asked for."""
    streams: dict[str, Iterator[SourceFile]] = {}
    for language in languages:
        if language == "python":
            streams[language] = stdlib_sources()
        else:
            streams[language] = package_sources([language])
    return streams


# ---- verification --------------------------------------------------------------------


def _jail_name(language: str) -> str:
    return f"task{PARSE_EXTENSIONS[language]}"


async def _apply(task: SynthTask, sem: asyncio.Semaphore) -> str | None:
    """``None`` when ast-grep's output is exactly the expected post-text, else the reason."""
    from sandbox import AstGrepAction, apply_astgrep_async

    name = _jail_name(task.language)
    action = AstGrepAction(
        pattern=task.gold_action.pattern,
        rewrite=task.gold_action.rewrite,
        language=task.gold_action.language,
    )
    async with sem:
        result = await apply_astgrep_async(action, {name: task.pre})
    if not result.ok:
        return "apply_error"
    if name not in result.changed_files:
        return "no_match"
    if result.changed_files[name] != task.post:
        return "post_mismatch"
    return None


async def verify_tasks(
    tasks: Sequence[SynthTask],
) -> tuple[list[SynthTask], dict[str, dict[str, int]], int]:
    """Keep the tasks whose gold action reproduces the post-text in the jail and whose
    post-text re-parses; return them, the refusals per template and reason, and the
    number of jail runs (one ast-grep rewrite per task, parse checks batched)."""
    sem = asyncio.Semaphore(VERIFY_CONCURRENCY)
    reasons = await asyncio.gather(*(_apply(t, sem) for t in tasks))
    refused: dict[str, dict[str, int]] = {}
    applied = []
    for task, reason in zip(tasks, reasons, strict=True):
        if reason is None:
            applied.append(task)
        else:
            refused.setdefault(task.template, {}).setdefault(reason, 0)
            refused[task.template][reason] += 1
    runs = len(tasks)
    kept: list[SynthTask] = []
    by_lang: dict[str, list[SynthTask]] = {}
    for task in applied:
        by_lang.setdefault(task.language, []).append(task)
    for language, group in sorted(by_lang.items()):
        ok = await astgrep_parses({t.task_id: t.post for t in group}, language)
        runs += -(-len(group) // PARSE_BATCH)
        for task in group:
            if not ok[task.task_id]:
                reason = "reparse_failed"
            elif language == "python" and not python_parses(task.post):
                # A zero-width MISSING node: invisible to ast-grep's ERROR rule.
                reason = "ast_parse_failed"
            else:
                kept.append(task)
                continue
            refused.setdefault(task.template, {}).setdefault(reason, 0)
            refused[task.template][reason] += 1
    order = {t.task_id: i for i, t in enumerate(tasks)}
    kept.sort(key=lambda t: order[t.task_id])
    return kept, refused, runs


def _merge(into: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> None:
    for template, reasons in more.items():
        for reason, n in reasons.items():
            into.setdefault(template, {}).setdefault(reason, 0)
            into[template][reason] += n


def _quotas(languages: Sequence[str], limit: int) -> dict[str, int]:
    base, extra = divmod(limit, len(languages))
    return {lang: base + (1 if i < extra else 0) for i, lang in enumerate(languages)}


class _Synthesis:
    """The run's state: the candidates each language has waiting, the tasks verified,
    what was refused and how much it cost (sources read, candidates, jail runs)."""

    def __init__(
        self, langs: Sequence[str], streams: dict[str, Iterator[SourceFile]], seeds: Sequence[int]
    ) -> None:
        self.streams = streams
        self.seeds = seeds
        self.kept: dict[str, list[SynthTask]] = {lang: [] for lang in langs}
        self.pending: dict[str, list[SynthTask]] = {lang: [] for lang in langs}
        self.refused: dict[str, dict[str, int]] = {}
        self.seen: set[str] = set()
        self.used: list[SourceFile] = []
        self.candidates = 0
        self.runs = 0
        self.exhausted: set[str] = set()

    def _synthesise_more(self, language: str) -> bool:
        """The next chunk of ``language``'s sources made into candidates; False when its
        sources have run out."""
        chunk = [s for _, s in zip(range(SOURCE_CHUNK), self.streams[language], strict=False)]
        if not chunk:
            self.exhausted.add(language)
            return False
        self.used.extend(chunk)
        report = synthesise(chunk, self.seeds)
        for template, n in report.refused.items():
            _merge(self.refused, {template: {"not_applicable": n}})
        fresh = [t for t in report.tasks if t.task_id not in self.seen]
        self.seen.update(t.task_id for t in fresh)
        self.pending[language].extend(fresh)
        return True

    async def fill(self, language: str, want: int) -> None:
        """Verify only as many candidates as are still missing, in source order."""
        kept, pending = self.kept[language], self.pending
        while len(kept) < want:
            if not pending[language]:
                if not self._synthesise_more(language):
                    return
                continue
            need = want - len(kept)
            batch, pending[language] = pending[language][:need], pending[language][need:]
            self.candidates += len(batch)
            ok, more_refused, more_runs = await verify_tasks(batch)
            self.runs += more_runs
            _merge(self.refused, more_refused)
            kept.extend(ok)

    def outcome(self, langs: Sequence[str], quotas: dict[str, int], seconds: float) -> SynthOutcome:
        kept = self.kept
        notes = [
            f"{language}: only {len(kept[language])} verified tasks; no more licensed sources found"
            for language in langs
            if language in self.exhausted and len(kept[language]) < quotas[language]
        ]
        by_package: dict[str, int] = {}
        for s in self.used:
            by_package[s.package] = by_package.get(s.package, 0) + 1
        runs = self.runs
        return SynthOutcome(
            tasks=[t for lang in langs for t in kept[lang]],
            verified_by_language={lang: len(kept[lang]) for lang in langs},
            candidates=self.candidates,
            refused=self.refused,
            sources=len(self.used),
            sources_by_package=by_package,
            jail_runs=runs,
            seconds=round(seconds, 3),
            seconds_per_jail_run=round(seconds / runs, 4) if runs else 0.0,
            notes=notes,
        )


async def verified_synth_tasks(
    *,
    languages: Sequence[str],
    limit: int,
    seeds: Sequence[int] = (0,),
    sources: Sequence[SourceFile] | None = None,
) -> SynthOutcome:
    """Up to ``limit`` verified tasks, shared evenly among ``languages`` (a language that
    runs out of sources leaves its share to the others).

    ``sources`` replaces the installed-package sources (tests, a user's own licensed
    files). Deterministic: the same sources, seeds and limit give the same tasks.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    langs = list(dict.fromkeys(languages))
    unknown = [lang for lang in langs if lang not in PARSE_EXTENSIONS]
    if unknown:
        raise ValueError(f"no synthetic templates for {unknown}; use {sorted(PARSE_EXTENSIONS)}")
    started = time.monotonic()
    if sources is not None:
        streams: dict[str, Iterator[SourceFile]] = {
            lang: iter([s for s in sources if s.language == lang]) for lang in langs
        }
    else:
        streams = collect_sources(langs)
    quotas = _quotas(langs, limit)
    run = _Synthesis(langs, streams, seeds)
    for language in langs:
        await run.fill(language, quotas[language])
    short = limit - sum(len(v) for v in run.kept.values())
    for language in langs:
        if short <= 0:
            break
        before = len(run.kept[language])
        await run.fill(language, before + short)
        short -= len(run.kept[language]) - before
    return run.outcome(langs, quotas, time.monotonic() - started)
