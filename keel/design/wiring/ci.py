"""CI workflows: the images they build and push, and the Terraform they run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keel.design.wiring.commands import TfCommand, shell_commands, terraform_command
from keel.design.wiring.terraform import _join


def _workflows(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(files):
        if path.startswith(".github/workflows/") and path.endswith((".yml", ".yaml")):
            try:
                doc = yaml.safe_load(files[path])
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict):
                out[path] = doc
    return out


def _step_lines(text: str) -> dict[tuple[str, int], int]:
    """The 1-based line of each step of each job, ``(job, step index) -> line`` (PyYAML's
    plain load keeps no positions; the composed node tree does)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[tuple[str, int], int] = {}
    if not isinstance(root, yaml.MappingNode):
        return out
    for key, jobs in root.value:
        if key.value != "jobs" or not isinstance(jobs, yaml.MappingNode):
            continue
        for job_key, job in jobs.value:
            if not isinstance(job, yaml.MappingNode):
                continue
            for field_key, steps in job.value:
                if field_key.value == "steps" and isinstance(steps, yaml.SequenceNode):
                    for i, step in enumerate(steps.value):
                        out[(str(job_key.value), i)] = step.start_mark.line + 1
    return out


def _env_names(*envs: Any) -> list[str]:
    names: list[str] = []
    for env in envs:
        if isinstance(env, dict):
            names += [str(k) for k in env]
    return names


def _matrix_rows(job: Mapping[str, Any]) -> list[dict[str, str]]:
    strategy = job.get("strategy")
    matrix = strategy.get("matrix") if isinstance(strategy, dict) else None
    if not isinstance(matrix, dict):
        return [{}]
    rows: list[dict[str, str]] = [{}]
    for key, values in matrix.items():
        if key in ("include", "exclude") or not isinstance(values, list):
            continue
        rows = [{**row, str(key): str(v)} for row in rows for v in values]
    include = matrix.get("include")
    if isinstance(include, list):
        extra = [
            {str(k): str(v) for k, v in row.items()} for row in include if isinstance(row, dict)
        ]
        rows = extra if rows == [{}] else rows + extra
    return rows


_EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _substitute(text: str, row: Mapping[str, str], ecr_steps: set[str]) -> str:
    def put(m: re.Match[str]) -> str:
        expr = m.group(1)
        if expr.startswith("matrix.") and expr[7:] in row:
            return row[expr[7:]]
        if expr.startswith("env."):
            return "${" + expr[4:] + "}"
        step = re.match(r"steps\.([\w-]+)\.outputs\.registry$", expr)
        if step:
            return "<ecr>" if step.group(1) in ecr_steps else f"<registry:{step.group(1)}>"
        return "<" + expr + ">"

    return _EXPR.sub(put, text)


@dataclass(frozen=True)
class CiImage:
    """An image a CI workflow pushes: ``repository:tag`` in an ECR registry."""

    file: str
    registry: str
    repository: str
    tag: str
    dockerfile: str | None


@dataclass(frozen=True)
class CiBuild:
    """An image a CI step builds (once per row of the job's matrix): where the step is,
    the Dockerfile, and whether the same job row pushes it or runs it (``docker run``)."""

    file: str
    line: int  # the step's line in the workflow (0: unknown)
    job: str
    step: str  # the step's name, or what it uses/runs
    dockerfile: str | None
    pushed: bool
    run: bool


@dataclass
class _Build:
    """A build while its job row is walked: its tags grow with ``docker tag``."""

    file: str
    line: int
    job: str
    step: str
    dockerfile: str | None
    tags: set[str]
    pushed: bool = False
    run: bool = False

    def done(self) -> CiBuild:
        return CiBuild(
            self.file, self.line, self.job, self.step, self.dockerfile, self.pushed, self.run
        )


def _docker_builds(argv: list[str], cwd: str) -> tuple[list[str], str | None]:
    tags: list[str] = []
    dockerfile = None
    context = None
    i = 2 if argv[:2] == ["docker", "build"] else 3
    while i < len(argv):
        tok = argv[i]
        if tok in ("-t", "--tag") and i + 1 < len(argv):
            tags.append(argv[i + 1])
            i += 2
            continue
        if tok.startswith("--tag="):
            tags.append(tok.split("=", 1)[1])
        elif tok in ("-f", "--file") and i + 1 < len(argv):
            dockerfile = argv[i + 1]
            i += 2
            continue
        elif tok.startswith("--file="):
            dockerfile = tok.split("=", 1)[1]
        elif not tok.startswith("-"):
            context = tok
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in tok:
            i += 2
            continue
        i += 1
    base = _join(cwd, context or ".")
    path = _join(cwd, dockerfile) if dockerfile else _join(base, "Dockerfile")
    return tags, path


def _split_ref(ref: str) -> tuple[str, str, str]:
    """(registry, repository, tag) of an image reference."""
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
    registry, _, repository = name.partition("/")
    if not repository:
        registry, repository = "", name
    return registry, repository, tag


def _job_dir(job: Mapping[str, Any]) -> str:
    """The job's ``defaults.run.working-directory``, or ``.``."""
    defaults = job.get("defaults")
    run_defaults = defaults.get("run") if isinstance(defaults, dict) else None
    return run_defaults.get("working-directory", ".") if isinstance(run_defaults, dict) else "."


def _is_docker_build(argv: list[str]) -> bool:
    """Whether ``argv`` is ``docker build`` or ``docker buildx build``."""
    return argv[:2] == ["docker", "build"] or argv[:3] == ["docker", "buildx", "build"]


@dataclass
class _Step:
    """The step being walked: its workflow, job, line and the builds of its job row."""

    file: str
    job: str
    line: int
    name: str
    builds: list[_Build]


def _step_name(step: Mapping[str, Any]) -> str:
    if step.get("name"):
        return str(step["name"])
    if step.get("uses"):
        return str(step["uses"])
    return str(step.get("run", "")).strip().splitlines()[0] if step.get("run") else "a step"


@dataclass
class _CiScan:
    """What ``ci_images`` collects while it walks the workflows."""

    pushed: list[CiImage] = field(default_factory=list)
    commands: list[TfCommand] = field(default_factory=list)
    runs: set[str] = field(default_factory=set)
    builds: list[CiBuild] = field(default_factory=list)

    def build_push_action(
        self, at: _Step, step: Mapping[str, Any], row: Mapping[str, str], ecr_steps: set[str]
    ) -> None:
        """Record the image a ``docker/build-push-action`` step builds, and what it pushes."""
        with_ = step.get("with")
        if not isinstance(with_, dict):
            with_ = {}
        text = _substitute(str(with_.get("tags", "")), row, ecr_steps)
        tags = [t for t in re.split(r"[,\s]+", text) if t]
        dockerfile = _join(".", str(with_.get("file", "Dockerfile")))
        push = str(with_.get("push", "")).lower() == "true"
        at.builds.append(_Build(at.file, at.line, at.job, at.name, dockerfile, set(tags), push))
        for tag in tags if push else []:
            reg, repo, t = _split_ref(tag)
            self.pushed.append(CiImage(at.file, reg, repo, t, dockerfile))

    def shell_command(
        self,
        at: _Step,
        cdir: str,
        argv: list[str],
        tf_env: tuple[str, ...],
        built: dict[str, str | None],
    ) -> None:
        """Record one shell command of a ``run`` step: a terraform command, or a docker
        build/tag/push/run (``built`` maps each tag built so far in this job row to its
        Dockerfile)."""
        path = at.file
        cmd = terraform_command(path, cdir, argv, tf_env)
        if cmd is not None:
            self.commands.append(cmd)
        elif _is_docker_build(argv):
            built_tags, built_file = _docker_builds(argv, cdir)
            for tag in built_tags:
                built[tag] = built_file
            push = "--push" in argv
            build = _Build(path, at.line, at.job, at.name, built_file, set(built_tags), push)
            at.builds.append(build)
            if push:
                for tag in built_tags:
                    self.pushed.append(CiImage(path, *_split_ref(tag), built_file))
        elif argv[:2] == ["docker", "tag"] and len(argv) >= 4:
            built[argv[3]] = built.get(argv[2])
            for build in at.builds:
                if argv[2] in build.tags:
                    build.tags.add(argv[3])
        elif argv[:2] == ["docker", "push"] and len(argv) >= 3:
            ref = argv[-1]
            self.pushed.append(CiImage(path, *_split_ref(ref), built.get(ref)))
            for build in at.builds:
                build.pushed = build.pushed or ref in build.tags
        elif argv[:2] == ["docker", "run"]:
            for build in at.builds:
                build.run = build.run or any(tok in build.tags for tok in argv[2:])

    def job(
        self,
        path: str,
        doc: Mapping[str, Any],
        name: str,
        job: Mapping[str, Any],
        lines: Mapping[tuple[str, int], int],
    ) -> None:
        """Walk every step of one job, once per row of its matrix."""
        raw = job.get("steps") or []
        steps = [(i, s) for i, s in enumerate(raw) if isinstance(s, dict)]
        ecr_steps = {
            str(s.get("id"))
            for _, s in steps
            if str(s.get("uses", "")).startswith("aws-actions/amazon-ecr-login")
        }
        job_dir = _job_dir(job)
        for row in _matrix_rows(job):
            built: dict[str, str | None] = {}
            builds: list[_Build] = []
            for index, step in steps:
                at = _Step(path, name, lines.get((name, index), 0), _step_name(step), builds)
                env = _env_names(doc.get("env"), job.get("env"), step.get("env"))
                uses = str(step.get("uses", ""))
                if uses.startswith("docker/build-push-action"):
                    self.build_push_action(at, step, row, ecr_steps)
                    continue
                run = step.get("run")
                if not isinstance(run, str):
                    continue
                text = _substitute(run, row, ecr_steps)
                self.runs.add(text)
                cwd = _join(".", str(step.get("working-directory", job_dir)))
                for cdir, argv, tf_env in shell_commands(text, cwd, env)[0]:
                    self.shell_command(at, cdir, argv, tf_env, built)
            self.builds += [b.done() for b in builds]


def ci_images(
    files: Mapping[str, str],
) -> tuple[list[CiImage], list[TfCommand], set[str], list[CiBuild]]:
    """Images the CI workflows push, the terraform commands they run, every text their
    ``run`` steps hold (for uploads), and every image they build."""
    scan = _CiScan()
    for path, doc in _workflows(files).items():
        jobs = doc.get("jobs")
        if not isinstance(jobs, dict):
            continue
        lines = _step_lines(files[path])
        for name, job in jobs.items():
            if isinstance(job, dict):
                scan.job(path, doc, str(name), job, lines)
    return scan.pushed, scan.commands, scan.runs, scan.builds
