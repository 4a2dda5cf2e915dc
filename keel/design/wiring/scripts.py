"""Script jobs: the Glue jobs and EMR Serverless job runs a design's Terraform starts.

A script job runs a repository file that Terraform uploads (a Glue job's
``script_location``, an EMR Serverless ``StartJobRun``'s ``EntryPoint``) with the
arguments the Terraform gives it (a Glue job's ``default_arguments``, a job run's
``EntryPointArguments``, both ``--name value`` pairs) and the role it names (``role_arn``,
``ExecutionRoleArn``). A job run is found where something submits it: an EventBridge
Scheduler schedule whose target is ``arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun``
or a Step Functions state machine with an ``emr-serverless:startJobRun`` Task, its
``ApplicationId`` naming the application.

The script reads its arguments (the name bound to ``job_arguments(...)`` or Glue's
``getResolvedOptions(...)``): :func:`script_arguments` says which it reads without
checking they are there, and which environment variables it sets from which argument
(``os.environ["DATA_URI"] = args["data_uri"]``), the only environment the code it imports
gets: the ``environment`` rule checks both, ``permissions`` the role, ``jobs`` the upload.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from keel.design.wiring.code import _parsed
from keel.design.wiring.images import normalised, pins_of
from keel.design.wiring.jobs import uploaded_file
from keel.design.wiring.model import _STRING, Block, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _json_objects, _json_values, _unwrap

#: A Task or universal target that starts an EMR Serverless job run.
EMR_START = re.compile(r"emrserverless:startJobRun|emr-serverless:startJobRun")
_ARGUMENT_READERS = ("job_arguments", "getResolvedOptions")


@dataclass(frozen=True)
class JobRun:
    """A script job: where it is declared, its kind (``glue``, ``emr``), the script's URI
    and repository file (None: not uploaded from the repository), its arguments (name
    without ``--`` -> value), the text naming its role and, for EMR, its application."""

    module: TfModule
    block: Block
    kind: str
    script_uri: str
    script: str | None
    args: Mapping[str, str] = field(default_factory=dict)
    role: str = ""
    application: str = ""

    @property
    def where(self) -> str:
        return f"{self.block.kind}.{self.block.name}"


def _pairs(values: list[str]) -> dict[str, str]:
    """``--name value`` pairs of an argument list (a flag without a value maps to "")."""
    out: dict[str, str] = {}
    for i, token in enumerate(values):
        if token.startswith("--"):
            nxt = values[i + 1] if i + 1 < len(values) else "--"
            out[token[2:]] = "" if nxt.startswith("--") else nxt
    return out


def _emr_runs(repo: Repo, mod: TfModule, block: Block) -> list[JobRun]:
    text = _all_text(block.body)
    if not EMR_START.search(text):
        return []
    application = next((v for _, v in _json_values(text, ["ApplicationId"])), "")
    role = next((v for _, v in _json_values(text, ["ExecutionRoleArn"])), "")
    out: list[JobRun] = []
    for driver in _json_objects(text, "SparkSubmit"):
        entry = next((v for _, v in _json_values(driver, ["EntryPoint"])), "")
        args: list[str] = []
        for arr in _json_objects(driver, "EntryPointArguments"):
            args += re.findall(_STRING, arr)
        script = uploaded_file(repo, mod, entry) if entry else None
        out.append(JobRun(mod, block, "emr", entry, script, _pairs(args), role, application))
    return out


def job_runs(repo: Repo) -> list[JobRun]:
    """Every Glue job and submitted EMR Serverless job run of the Terraform."""
    out: list[JobRun] = []
    for mod in repo.modules.values():
        for block in mod.resources:
            if block.kind == "aws_glue_job":
                command = _unwrap(block.body.get("command"))
                uri = str(command.get("script_location", "")) if isinstance(command, dict) else ""
                raw = block.body.get("default_arguments")
                args = (
                    {str(k).strip('"').removeprefix("--"): str(v) for k, v in raw.items()}
                    if isinstance(raw, dict)
                    else {}
                )
                script = uploaded_file(repo, mod, uri) if uri else None
                role = str(block.body.get("role_arn", ""))
                out.append(JobRun(mod, block, "glue", uri, script, args, role))
            elif block.kind in ("aws_scheduler_schedule", "aws_sfn_state_machine"):
                out += _emr_runs(repo, mod, block)
    return out


@dataclass(frozen=True)
class ScriptArguments:
    """What a job script does with its arguments: those it reads without checking they
    are there (name -> line), and the environment variables it sets from one (variable
    -> argument name)."""

    required: Mapping[str, int]
    sets_env: Mapping[str, str]


def _key(node: ast.expr, names: set[str]) -> str | None:
    """``"k"`` of ``args["k"]`` (``args`` one of ``names``)."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return node.slice.value
    return None


@functools.lru_cache(maxsize=256)
def script_arguments(text: str) -> ScriptArguments:
    tree = _parsed(text)
    if tree is None:
        return ScriptArguments({}, {})
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name | ast.Attribute)
        ):
            func = node.value.func
            called = func.id if isinstance(func, ast.Name) else func.attr
            if called in _ARGUMENT_READERS:
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    checked: set[str] = set()
    read: dict[str, int] = {}
    sets_env: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                isinstance(c, ast.Name) and c.id in names for c in node.comparators
            ):
                checked.add(str(node.left.value))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = _key(node, names)
            if key is not None:
                read.setdefault(key, node.lineno)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            arg = _key(node.value, names)
            if (
                arg is not None
                and isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Attribute)
                and target.value.attr == "environ"
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                sets_env[target.slice.value] = arg
    required = {k: line for k, line in read.items() if k not in checked}
    return ScriptArguments(required, sets_env)


def job_env(repo: Repo, run: JobRun) -> frozenset[str]:
    """The environment variables ``run``'s script sets from arguments the job passes."""
    if run.script is None:
        return frozenset()
    sets = script_arguments(repo.files[run.script]).sets_env
    return frozenset(name for name, arg in sets.items() if arg in run.args)


def check_applications(repo: Repo) -> list[Finding]:
    """Rule ``jobs``: an EMR Serverless application runs nothing until a job run is
    submitted to it: some schedule or state machine of its module must start one (its
    ``ApplicationId`` the application's), with an entry point the repository uploads
    (the upload itself is :func:`~keel.design.wiring.jobs.check_jobs`'s)."""
    runs = [r for r in job_runs(repo) if r.kind == "emr"]
    out: list[Finding] = []
    for mod in repo.modules.values():
        for app in mod.of_kind("aws_emrserverless_application"):
            ref = f"aws_emrserverless_application.{app.name}."
            mine = [r for r in runs if r.module is mod and ref in r.application]
            if not mine:
                out.append(
                    Finding(
                        "jobs",
                        app.file,
                        f"aws_emrserverless_application.{app.name}: no job run is submitted "
                        "to it (no schedule or state machine of the module calls "
                        "StartJobRun with its ApplicationId), so it never runs the "
                        "repository's code",
                    )
                )
            for run in mine:
                if not run.script_uri:
                    out.append(
                        Finding(
                            "jobs",
                            run.block.file,
                            f"{run.where}: the job run it submits to "
                            f"aws_emrserverless_application.{app.name} names no EntryPoint",
                        )
                    )
    return out


#: The Python of each Glue version's Spark jobs (AWS Glue release notes); a job without
#: ``glue_version`` runs 0.9.
GLUE_PYTHON: Mapping[str, tuple[int, int]] = {
    "5.1": (3, 11),
    "5.0": (3, 11),
    "4.0": (3, 10),
    "3.0": (3, 7),
    "2.0": (3, 7),
    "1.0": (3, 6),
    "0.9": (2, 7),
}
_REQUIRES_PYTHON = re.compile(r'^requires-python\s*=\s*"[^"]*>=\s*(\d+)\.(\d+)', re.M)


def required_python(repo: Repo) -> tuple[int, int] | None:
    """The oldest Python the repository's ``pyproject.toml`` allows (``requires-python``)."""
    m = _REQUIRES_PYTHON.search(repo.files.get("pyproject.toml", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _pins(text: str) -> list[str]:
    """``name==version`` of each pin of a requirements text, names normalised."""
    return [f"{normalised(name)}=={version}" for _, name, version in pins_of(text)]


def check_job_python(repo: Repo) -> list[Finding]:
    """Rule ``jobs``: a Glue job runs the repository's code on a Python it supports
    (``glue_version``'s, at least ``requires-python``) with the repository's pinned
    requirements installed: ``--additional-python-modules`` is the uploaded
    ``requirements.txt`` with ``--python-modules-installer-option -r``, or lists every
    pin. Otherwise the job imports Glue's own pandas or numpy, or none (scikit-learn).

    EMR Serverless job runs: :func:`keel.design.wiring.emr.check_emr_python`."""
    need = required_python(repo)
    pins = _pins(repo.files.get("requirements.txt", ""))
    out: list[Finding] = []
    for run in job_runs(repo):
        if run.kind != "glue":
            continue
        version = str(run.block.body.get("glue_version", "0.9")).strip('"')
        python = GLUE_PYTHON.get(version)
        if need is not None and (python is None or python < need):
            runs = "an unknown Python" if python is None else f"Python {python[0]}.{python[1]}"
            out.append(
                Finding(
                    "jobs",
                    run.block.file,
                    f"{run.where}: glue_version {version} runs {runs}, and the repository's "
                    f"code needs Python >= {need[0]}.{need[1]} (pyproject.toml requires-python)",
                )
            )
        if not pins:
            continue
        modules = run.args.get("additional-python-modules", "").strip('"')
        if modules.startswith("s3://"):
            installer = run.args.get("python-modules-installer-option", "").strip('"').split()
            file = uploaded_file(repo, run.module, modules)
            if file != "requirements.txt" or "-r" not in installer:
                why = (
                    "without --python-modules-installer-option -r"
                    if file == "requirements.txt"
                    else "which is not the repository's requirements.txt uploaded by this module"
                )
                out.append(
                    Finding(
                        "jobs",
                        run.block.file,
                        f"{run.where}: --additional-python-modules is {modules}, {why}: the "
                        "job would not install the repository's pinned requirements",
                    )
                )
            continue
        listed = set(_pins("\n".join(modules.split(","))))
        missing = [p for p in pins if p not in listed]
        if missing:
            out.append(
                Finding(
                    "jobs",
                    run.block.file,
                    f"{run.where}: the job installs {len(pins) - len(missing)} of the "
                    f"{len(pins)} pins of requirements.txt (missing: {', '.join(missing[:5])}): "
                    "set --additional-python-modules to the uploaded requirements.txt with "
                    "--python-modules-installer-option -r",
                )
            )
    return out
