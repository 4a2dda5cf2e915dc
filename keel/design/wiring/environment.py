"""Rule ``environment``: every variable the code reads is set by the runtime that starts it
(a script job: from the arguments it is given, :mod:`.scripts`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import replace

from keel.design.wiring.code import (
    EnvRead,
    demanded,
    entry_modules,
    env_reads,
    import_closure,
    module_file,
    parse_dockerfile,
)
from keel.design.wiring.images import compose_builds, image_code, runtimes
from keel.design.wiring.lambdas import Package, archives
from keel.design.wiring.model import RUNTIME_PROVIDED, Finding
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import job_env, job_runs, script_arguments


def _compose_runtimes(files: Mapping[str, str]) -> list[tuple[str, str, list[str], frozenset[str]]]:
    """(compose file, service, files it starts, variables it sets)."""
    out = []
    for path, name, svc, dockerfile in compose_builds(files):
        parsed = parse_dockerfile(files.get(dockerfile, ""))
        env = svc.get("environment") or {}
        names = set(env) if isinstance(env, dict) else {str(e).split("=", 1)[0] for e in env}
        command = svc.get("command")
        cmd = (
            tuple(command)
            if isinstance(command, list)
            else (tuple(shlex.split(command)) if isinstance(command, str) else parsed.cmd)
        )
        starts = entry_modules(files, parsed.entrypoint + cmd, parsed.lambda_base)
        out.append((path, name, starts, frozenset(names | parsed.env)))
    return out


def _missing_env(repo: Repo, starts: list[str], provided: frozenset[str]) -> list[EnvRead]:
    """The variables the code ``starts`` imports reads and the runtime does not set: those
    whose default does not work deployed, and those read with ``None`` that the code
    raises without (:func:`~keel.design.wiring.code.demanded`)."""
    closure = import_closure(repo.files, starts)
    needs: dict[str, str] = {}
    for path in closure:
        for name, line in demanded(path, repo.files[path]).items():
            needs.setdefault(name, f"{path}:{line}")
    missing: dict[str, EnvRead] = {}
    for path in closure:
        for read in env_reads(path, repo.files[path]):
            if read.name in provided:
                continue
            if read.accepted:
                if read.default != "None" or read.name not in needs:
                    continue
                read = replace(read, default=f"None, and {needs[read.name]} raises without it")
            missing.setdefault(read.name, read)
    return [missing[k] for k in sorted(missing)]


def _env_message(what: str, runs: str, read: EnvRead) -> str:
    default = "no default" if read.default == "none" else f"default {read.default}"
    return (
        f"{what} runs {runs}, which reads {read.name} ({read.file}:{read.line}, {default}), "
        "and nothing sets it there"
    )


def check_environment(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    #: (module, image) -> the variables its task definition's runtime misses: a
    #: scheduled override of that task reports only the others (one cause, one finding).
    task_missing: dict[tuple[str, str], set[str]] = {}
    for rt in sorted(runtimes(repo), key=lambda r: r.scheduled):
        provided = rt.env | RUNTIME_PROVIDED[rt.kind]
        if rt.handler:
            module = rt.handler.rsplit(".", 1)[0]
            for pkg in archives(
                repo, rt.module, {k: rt.block.body.get(k) for k in ("filename", "s3_key")}
            ) or [Package(".", (), "")]:
                path = module_file(repo.files, module, pkg.root) if pkg.root else None
                if path is None:
                    continue  # the lambda rule reports it
                for read in _missing_env(repo, [path], provided):
                    out.append(
                        Finding(
                            "environment", rt.block.file, _env_message(rt.where, rt.handler, read)
                        )
                    )
            continue
        for image in rt.images:
            code = image_code(repo, rt, image)
            if code is None:
                continue
            starts, image_env, dockerfile = code
            runs = " and ".join(starts) + f" ({dockerfile})"
            if rt.isolated and rt.addresses:
                out += _isolated_findings(repo, rt.block.file, rt.where, runs, starts, rt.addresses)
            key = (rt.module.dir, image)
            for read in _missing_env(repo, starts, provided | image_env):
                if rt.scheduled and read.name in task_missing.get(key, set()):
                    continue
                if rt.kind == "ecs" and not rt.scheduled:
                    task_missing.setdefault(key, set()).add(read.name)
                out.append(
                    Finding("environment", rt.block.file, _env_message(rt.where, runs, read))
                )
    out += _job_findings(repo)
    for path, name, starts, provided in _compose_runtimes(repo.files):
        for read in _missing_env(repo, starts, provided):
            out.append(
                Finding(
                    "environment", path, _env_message(f"service {name}", ", ".join(starts), read)
                )
            )
    return out


def _isolated_findings(
    repo: Repo, file: str, where: str, runs: str, starts: list[str], addresses: frozenset[str]
) -> list[Finding]:
    """A network-isolated SageMaker job handed a service's address its code reads: the
    call would fail (a SageMaker training registering in MLflow, whose server it cannot
    reach from an isolated container)."""
    found: dict[str, EnvRead] = {}
    for path in import_closure(repo.files, starts):
        for read in env_reads(path, repo.files[path]):
            if read.name in addresses:
                found.setdefault(read.name, read)
    return [
        Finding(
            "environment",
            file,
            f"{where} runs {runs} network-isolated (EnableNetworkIsolation), and it reads "
            f"{name} ({found[name].file}:{found[name].line}), the address of a service "
            "it cannot reach from there",
        )
        for name in sorted(found)
    ]


def _job_findings(repo: Repo) -> list[Finding]:
    """A script job (Glue job, EMR Serverless job run) gets no environment from the
    Terraform: only what its script sets from the arguments the job passes
    (:func:`~keel.design.wiring.scripts.job_env`). Every argument the script reads
    without checking it is there is passed, and every variable the code it imports reads
    is set that way (or its default works deployed)."""
    out: list[Finding] = []
    for run in job_runs(repo):
        if run.script is None:
            continue  # the jobs rule reports it
        arguments = script_arguments(repo.files[run.script])
        for name, line in sorted(arguments.required.items()):
            if name not in run.args:
                out.append(
                    Finding(
                        "environment",
                        run.block.file,
                        f"{run.where} runs {run.script}, which reads the argument --{name} "
                        f"({run.script}:{line}) without checking it is there, and the job "
                        "does not pass it",
                    )
                )
        provided = job_env(repo, run) | RUNTIME_PROVIDED[run.kind]
        for read in _missing_env(repo, [run.script], provided):
            out.append(
                Finding("environment", run.block.file, _env_message(run.where, run.script, read))
            )
    return out
