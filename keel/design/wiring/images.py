"""Rule ``images``: every image run is built, pushed to a declared ECR repository and tagged
as run; every repository CI pushes to is declared and run; every image CI builds is used;
a package an image pins is the version the repository's requirements pin."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keel.design.wiring.code import entry_modules, parse_dockerfile
from keel.design.wiring.commands import logical_lines
from keel.design.wiring.model import (
    _ECR_IMAGE,
    _ENV_NAME,
    _STRING,
    _VAR_ONLY,
    Block,
    Finding,
    Instance,
    TfModule,
)
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import (
    _all_text,
    _dirname,
    _join,
    _json_objects,
    _json_values,
    _resolve,
    _unwrap,
)

#: The endings of a variable that holds a service's address.
ADDRESS_SUFFIXES = ("_URI", "_URL", "_ENDPOINT", "_HOST")
_ISOLATED = re.compile(r'"EnableNetworkIsolation"\s*:\s*true')


@dataclass(frozen=True)
class Runtime:
    """Something the Terraform starts that runs code: where it is declared, its kind
    (``ecs``, ``lambda``, ``sagemaker``), the images it runs and the variables it sets.
    An EventBridge Scheduler ECS target that overrides the task's command is one too
    (``ecs``, declared by the schedule, its role the task definition's)."""

    module: TfModule
    block: Block
    kind: str
    images: tuple[str, ...]
    env: frozenset[str]
    command: tuple[str, ...] | None = None
    handler: str | None = None
    #: The image's entry point as the runtime overrides it (a SageMaker processing job's
    #: ``AppSpecification.ContainerEntrypoint``): it replaces the Dockerfile's
    #: ``ENTRYPOINT`` and drops its ``CMD`` (``command`` then holds the arguments given).
    entrypoint: tuple[str, ...] | None = None
    #: A SageMaker training job run with ``EnableNetworkIsolation``: it reaches nothing
    #: on the network (its data comes through channels, its model goes out through
    #: ``/opt/ml/model``), so the service addresses it is handed (``addresses``: the
    #: ``*_URI``/``*_URL``/``*_ENDPOINT``/``*_HOST`` variables it sets to something other
    #: than an ``s3://`` location) are of no use to it. (A batch transform's model, isolated
    #: too, serves the archive SageMaker unpacked, from local files: not flagged.)
    isolated: bool = False
    addresses: frozenset[str] = frozenset()
    #: The role a SageMaker job or model runs as (its ``RoleArn``/``ExecutionRoleArn``
    #: or ``execution_role_arn``), or a scheduled task's (its task definition's
    #: ``task_role_arn``), as text naming ``aws_iam_role.<name>``.
    role: str = ""

    @property
    def where(self) -> str:
        return f"{self.block.kind}.{self.block.name}"

    @property
    def scheduled(self) -> bool:
        """A schedule's override of a task definition's command (its image and base
        environment are the task definition's, whose runtime reports them)."""
        return self.block.kind == "aws_scheduler_schedule"


def _json_keys(obj: str) -> set[str]:
    """Top-level keys of an encoded object ``{...}``."""
    keys: set[str] = set()
    depth = 0
    i, quoted, start = 0, False, -1
    while i < len(obj):
        ch = obj[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
                if depth == 1:
                    j = i + 1
                    while j < len(obj) and obj[j] == " ":
                        j += 1
                    if j < len(obj) and obj[j] == ":" and _ENV_NAME.match(obj[start + 1 : i]):
                        keys.add(obj[start + 1 : i])
        elif ch == '"':
            quoted, start = True, i
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        i += 1
    return keys


_SAGEMAKER_ROLE = re.compile(r"(?:RoleArn|ExecutionRoleArn)\W+(?:\$\{)?aws_iam_role\.\w+\.")


def image_command(body: dict[str, Any]) -> tuple[str, ...] | None:
    """An image function's ``image_config { command = [...] }`` (it replaces the image's
    CMD: for a Lambda base image, the handler), or None."""
    config = _unwrap(body.get("image_config"))
    command = config.get("command") if isinstance(config, dict) else None
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        return tuple(command)
    return None


_TASK_REF = re.compile(r"aws_ecs_task_definition\.(\w+)\.")


def _scheduled_tasks(mod: TfModule, block: Block) -> list[Runtime]:
    """An EventBridge Scheduler ECS target that overrides its task's command: a runtime
    of its own (the task definition's images, environment and role; the override's
    command and environment). Without an override the task definition's runtime covers
    what it runs."""
    target = _unwrap(block.body.get("target"))
    if not isinstance(target, dict):
        return []
    params = _unwrap(target.get("ecs_parameters"))
    ref = _TASK_REF.search(_all_text(params)) if isinstance(params, dict) else None
    task = mod.resource("aws_ecs_task_definition", ref.group(1)) if ref else None
    overrides = _json_objects(str(target.get("input", "")), "containerOverrides")
    if task is None or not overrides:
        return []
    (base,) = _task_runtime(mod, task)
    out: list[Runtime] = []
    for override in overrides:
        commands = _json_objects(override, "command")
        if not commands:
            continue
        env = set(base.env)
        for arr in _json_objects(override, "environment"):
            env |= {v for _, v in _json_values(arr, ["name"])}
        out.append(
            Runtime(
                mod,
                block,
                "ecs",
                base.images,
                frozenset(env),
                tuple(re.findall(_STRING, commands[0])),
                role=_all_text(task.body.get("task_role_arn", "")),
            )
        )
    return out


def _task_runtime(mod: TfModule, block: Block) -> list[Runtime]:
    text = str(block.body.get("container_definitions", ""))
    images = tuple(v for _, v in _json_values(text, ["image"]))
    env: set[str] = set()
    for arr in [*_json_objects(text, "environment"), *_json_objects(text, "secrets")]:
        env |= {v for _, v in _json_values(arr, ["name"])}
    command = None
    for arr in _json_objects(text, "command"):
        command = tuple(re.findall(_STRING, arr))
    return [Runtime(mod, block, "ecs", images, frozenset(env), command)]


def runtimes(repo: Repo) -> list[Runtime]:
    out: list[Runtime] = []
    for mod in repo.modules.values():
        for block in mod.resources:
            body = block.body
            if block.kind == "aws_ecs_task_definition":
                out += _task_runtime(mod, block)
            elif block.kind == "aws_lambda_function":
                env_block = _unwrap(body.get("environment")) or {}
                variables = env_block.get("variables") if isinstance(env_block, dict) else None
                names = frozenset(variables) if isinstance(variables, dict) else frozenset()
                image = body.get("image_uri")
                out.append(
                    Runtime(
                        mod,
                        block,
                        "lambda",
                        (str(image),) if image else (),
                        names,
                        command=image_command(body),
                        handler=None if image else str(body.get("handler", "")),
                    )
                )
            elif block.kind == "aws_sfn_state_machine":
                text = str(body.get("definition", ""))
                for params in _json_objects(text, "Parameters"):
                    # A model package's containers (CreateModelPackage) are registered,
                    # not run, by the state.
                    for spec in _json_objects(params, "InferenceSpecification"):
                        params = params.replace(spec, "{}")
                    images = tuple(
                        v for _, v in _json_values(params, ["Image", "TrainingImage", "ImageUri"])
                    )
                    if not images:
                        continue
                    env: set[str] = set()
                    addresses: set[str] = set()
                    for obj in _json_objects(params, "Environment"):
                        keys = _json_keys(obj)
                        env |= keys
                        addresses |= {
                            name
                            for name, value in _json_values(obj, keys)
                            if name.endswith(ADDRESS_SUFFIXES) and not value.startswith("s3://")
                        }
                    role = _SAGEMAKER_ROLE.search(params)
                    entry: tuple[str, ...] | None = None
                    arguments: tuple[str, ...] | None = None
                    for arr in _json_objects(params, "ContainerEntrypoint"):
                        entry = tuple(re.findall(_STRING, arr))
                    for arr in _json_objects(params, "ContainerArguments"):
                        arguments = tuple(re.findall(_STRING, arr))
                    out.append(
                        Runtime(
                            mod,
                            block,
                            "sagemaker",
                            images,
                            frozenset(env),
                            command=() if entry is not None and arguments is None else arguments,
                            entrypoint=entry,
                            isolated=bool(_ISOLATED.search(params)) and "TrainingImage" in params,
                            addresses=frozenset(addresses),
                            role=role.group(0) if role else "",
                        )
                    )
            elif block.kind == "aws_scheduler_schedule":
                out += _scheduled_tasks(mod, block)
            elif block.kind == "aws_sagemaker_model":
                for key in ("primary_container", "container"):
                    cont = _unwrap(body.get(key))
                    if isinstance(cont, dict) and cont.get("image"):
                        env_map = cont.get("environment")
                        names = frozenset(env_map) if isinstance(env_map, dict) else frozenset()
                        out.append(
                            Runtime(
                                mod,
                                block,
                                "sagemaker",
                                (str(cont["image"]),),
                                names,
                                role=str(body.get("execution_role_arn", "")),
                            )
                        )
    return out


@dataclass(frozen=True)
class ResolvedImage:
    repository: str  # the ECR repository's name, as the instance resolves it
    tag_var: str  # the root variable the tag comes from ("" when none)
    problem: str  # why it cannot be pushed by CI ("" when it can)


def _resolve_image(repo: Repo, mod: TfModule, image: str) -> list[ResolvedImage] | str:
    """Each instance's (repository, root tag variable), or why the image is not from a
    declared ECR repository (``""``: an image AWS builds, accepted)."""
    if "aws_sagemaker_prebuilt_ecr_image" in image:
        return ""
    m = _ECR_IMAGE.match(image)
    if m is None:
        return f"image {image} is not from an ECR repository the Terraform declares"
    ecr = mod.resource("aws_ecr_repository", m.group(1))
    if ecr is None:
        return f"image {image}: {mod.dir}/ declares no aws_ecr_repository.{m.group(1)}"
    tag = _VAR_ONLY.match(m.group(2))
    out = []
    for inst in repo.instances_of(mod) or [Instance(mod, mod.dir, {}, None)]:
        name = str(_resolve(ecr.body.get("name", ""), inst.args))
        if tag is None:
            out.append(ResolvedImage(name, "", f"its tag {m.group(2)} is no variable"))
            continue
        var = tag.group(1)
        chain = var
        if inst.block is not None:
            arg = inst.args.get(var)
            root_var = _VAR_ONLY.match(arg) if isinstance(arg, str) else None
            if root_var is None:
                default = mod.variables.get(var)
                shown = repr(default.default) if default and default.has_default else "unset"
                out.append(
                    ResolvedImage(
                        name,
                        "",
                        f"its tag var.{var} is not passed from the root module "
                        f'(module "{inst.block.name}" leaves it at {shown})',
                    )
                )
                continue
            chain = root_var.group(1)
        out.append(ResolvedImage(name, chain, ""))
    return out


def _tag_matches(ci_tag: str, root_var: str) -> bool:
    m = re.fullmatch(r"\$\{?(\w+)\}?", ci_tag)
    if m is None:
        return False
    name = m.group(1)
    return name.lower() == root_var.lower() or name == f"TF_VAR_{root_var}"


def _pushed_findings(repo: Repo, run: set[str]) -> list[Finding]:
    """Each repository CI pushes to (in ECR) is an ``aws_ecr_repository`` of the Terraform
    (as each module instance names it), and a runtime of the Terraform runs it: a push to
    a repository nothing creates fails, and an image nothing runs is not deployed."""
    declared: set[str] = set()
    for inst in repo.instances:
        for block in inst.module.of_kind("aws_ecr_repository"):
            name = _resolve(block.body.get("name", ""), inst.args)
            if isinstance(name, str) and "${" not in name:
                declared.add(name)
    out: list[Finding] = []
    for push in repo.pushed:
        if not (push.registry == "<ecr>" or ".dkr.ecr." in push.registry):
            continue  # reported where a runtime runs it (not to ECR)
        built = f" ({push.dockerfile})" if push.dockerfile else ""
        if push.repository not in declared:
            shown = ", ".join(sorted(declared)) or "none"
            out.append(
                Finding(
                    "images",
                    push.file,
                    f"CI pushes {push.repository}{built}, which no aws_ecr_repository of "
                    f"the Terraform declares (it declares: {shown})",
                )
            )
        elif push.repository not in run:
            out.append(
                Finding(
                    "images",
                    push.file,
                    f"CI pushes {push.repository}{built}, but no task definition, Lambda "
                    "function, SageMaker job or model or EMR Serverless application of the "
                    "Terraform runs it",
                )
            )
    return out


#: The file names Docker Compose reads.
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.yaml", "compose.yml", "compose.yaml")


def compose_builds(files: Mapping[str, str]) -> list[tuple[str, str, dict[str, Any], str]]:
    """Each service a compose file builds from the repository: (compose file, service,
    its settings, the Dockerfile it builds)."""
    import yaml

    out = []
    for path in sorted(files):
        if posixpath.basename(path) not in COMPOSE_FILES:
            continue
        try:
            doc = yaml.safe_load(files[path])
        except yaml.YAMLError:
            continue
        services = doc.get("services") if isinstance(doc, dict) else None
        if not isinstance(services, dict):
            continue
        for name, svc in services.items():
            if not isinstance(svc, dict) or "build" not in svc:
                continue
            build = svc["build"]
            context = _join(
                _dirname(path), build if isinstance(build, str) else build.get("context", ".")
            )
            dockerfile = _join(
                context,
                build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile",
            )
            out.append((path, str(name), svc, dockerfile))
    return out


def _dockerfiles_of(repo: Repo, repository: str) -> list[str]:
    """The Dockerfiles an ECR repository's image is built from: those CI pushes to it
    with, then (not pushed: the images rule says so) the Dockerfile of a directory named
    as the repository's last segment (``<prefix>/serve``: ``services/serve/Dockerfile``)."""
    found = [
        p.dockerfile
        for p in repo.pushed
        if p.repository == repository and p.dockerfile is not None and p.dockerfile in repo.files
    ]
    last = repository.rsplit("/", 1)[-1]
    found += sorted(
        p for p in repo.files if p.endswith(f"/{last}/Dockerfile") or p == f"{last}/Dockerfile"
    )
    return found


def _unused_builds(repo: Repo, run: set[str]) -> list[Finding]:
    """Each image a CI step builds is used: pushed (by that job, or its Dockerfile by any
    CI push), run by a runtime of the Terraform (``run``: the ECR repositories they run,
    whose Dockerfiles :func:`_dockerfiles_of` finds), run by CI after the build (``docker
    run`` of its tag in the same job: an image built to be tested), or built by a compose
    file. Anything else is built for nothing: CI time, and a Dockerfile no one keeps."""
    used = {p.dockerfile for p in repo.pushed}
    used |= {f for repository in run for f in _dockerfiles_of(repo, repository)}
    used |= {dockerfile for _, _, _, dockerfile in compose_builds(repo.files)}
    used |= {b.dockerfile for b in repo.built if b.pushed or b.run}
    out: list[Finding] = []
    for b in repo.built:
        if b.dockerfile in used:
            continue
        where = f"{b.file}:{b.line}" if b.line else b.file
        out.append(
            Finding(
                "images",
                b.file,
                f"{where} (job {b.job}, step {b.step}) builds {b.dockerfile or 'an image'}, "
                "which nothing uses: no CI step pushes it or runs it (docker run), and no "
                "task definition, Lambda function, SageMaker job or model, or compose "
                "service runs it",
            )
        )
    return out


#: Distributions that are one project at one version number: an image that installs
#: ``mlflow`` (the server) serves clients of ``mlflow-skinny`` (the code), which must agree.
PIN_FAMILIES: dict[str, str] = {"mlflow-skinny": "mlflow", "mlflow-tracing": "mlflow"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([A-Za-z0-9.+!_-]+)$")


def normalised(name: str) -> str:
    """A distribution's normalised name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist(name: str) -> str:
    """A distribution's normalised name (PEP 503), its family's where it has one."""
    norm = normalised(name)
    return PIN_FAMILIES.get(norm, norm)


def pins_of(text: str) -> list[tuple[int, str, str]]:
    """(line, name, version) of each ``name==version`` of a requirements text (extras,
    comments, markers and spaces set aside)."""
    out: list[tuple[int, str, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        m = _PIN.match(raw.split("#", 1)[0].split(";", 1)[0].strip().replace(" ", ""))
        if m:
            out.append((n, m.group(1), m.group(2)))
    return out


def _is_dockerfile(path: str) -> bool:
    base = posixpath.basename(path)
    return base == "Dockerfile" or base.endswith(".Dockerfile") or base.startswith("Dockerfile.")


def _requirement_pins(files: Mapping[str, str]) -> dict[str, tuple[str, int, str, str]]:
    """Family -> (requirements file, line, name, version) of each ``name==version`` that a
    ``requirements*.txt`` of the repository pins (the first file, by path, wins)."""
    out: dict[str, tuple[str, int, str, str]] = {}
    for path in sorted(files):
        base = posixpath.basename(path)
        if not (base.startswith("requirements") and base.endswith(".txt")):
            continue
        for n, name, version in pins_of(files[path]):
            out.setdefault(_dist(name), (path, n, name, version))
    return out


def _image_pins(path: str, text: str) -> list[tuple[int, str, str]]:
    """(line, name, version) of each ``name==version`` a ``RUN ... pip install`` of a
    Dockerfile installs; the line is the physical line that holds it."""
    out: list[tuple[int, str, str]] = []
    physical = text.splitlines()
    for line in logical_lines(text):
        words = line.split()
        if not words or words[0].upper() != "RUN" or "pip" not in line:
            continue
        installing = False
        for word in words[1:]:
            if word in ("&&", "||", ";"):
                installing = False
            elif word == "install":
                installing = True
            elif installing and (m := _PIN.match(word.strip("'\""))):
                n = next((i for i, p in enumerate(physical, 1) if word in p), 0)
                out.append((n, m.group(1), m.group(2)))
    return out


def _pin_findings(repo: Repo) -> list[Finding]:
    """Each package an image pins (``pip install name==version`` in a Dockerfile) that the
    repository's requirements pin too is at the same version, families matched
    (:data:`PIN_FAMILIES`): the MLflow server image pinned ``mlflow==2.16.2`` while the
    code it serves, the clients, ran ``mlflow-skinny==3.18.0``."""
    pins = _requirement_pins(repo.files)
    out: list[Finding] = []
    for path in sorted(p for p in repo.files if _is_dockerfile(p)):
        for line, name, version in _image_pins(path, repo.files[path]):
            want = pins.get(_dist(name))
            if want is None or want[3] == version:
                continue
            req_file, req_line, req_name, req_version = want
            out.append(
                Finding(
                    "images",
                    path,
                    f"{path}:{line} installs {name}=={version}, but {req_file}:{req_line} pins "
                    f"{req_name}=={req_version}: the image and the code run different versions "
                    f"of {_dist(name)}",
                )
            )
    return out


def application_image(app: Block) -> str | None:
    """The custom image an EMR Serverless application runs (``image_configuration``)."""
    config = _unwrap(app.body.get("image_configuration"))
    image = config.get("image_uri") if isinstance(config, dict) else None
    return str(image) if image else None


def application_images(repo: Repo) -> list[Runtime]:
    """Each EMR Serverless application that runs a custom image: the job runs submitted
    to it run in that image, so it is run like a task's (kind ``emr``; its code is the
    job's entry point, the ``jobs`` rule's)."""
    return [
        Runtime(mod, block, "emr", (image,), frozenset())
        for mod in repo.modules.values()
        for block in mod.of_kind("aws_emrserverless_application")
        if (image := application_image(block)) is not None
    ]


def check_images(repo: Repo) -> list[Finding]:
    out: list[Finding] = _pin_findings(repo)
    run: set[str] = set()
    everything = [*runtimes(repo), *application_images(repo)]
    for rt in everything:
        for image in rt.images:
            resolved = _resolve_image(repo, rt.module, image)
            if not isinstance(resolved, str):
                run |= {img.repository for img in resolved}
    out += _pushed_findings(repo, run)
    out += _unused_builds(repo, run)
    for rt in everything:
        if rt.scheduled:
            continue  # its task definition's image, checked there
        for image in rt.images:
            resolved = _resolve_image(repo, rt.module, image)
            if isinstance(resolved, str):
                if resolved:
                    out.append(Finding("images", rt.block.file, f"{rt.where}: {resolved}"))
                continue
            for img in resolved:
                if img.problem:
                    out.append(
                        Finding(
                            "images",
                            rt.block.file,
                            f"{rt.where} runs {img.repository}: {img.problem}",
                        )
                    )
                pushes = [p for p in repo.pushed if p.repository == img.repository]
                if not pushes:
                    built = sorted({p.repository for p in repo.pushed}) or ["nothing"]
                    out.append(
                        Finding(
                            "images",
                            rt.block.file,
                            f"{rt.where} runs the ECR repository {img.repository}, which no CI "
                            f"workflow pushes to (they push: {', '.join(built)})",
                        )
                    )
                    continue
                if not any(p.registry == "<ecr>" or ".dkr.ecr." in p.registry for p in pushes):
                    out.append(
                        Finding(
                            "images",
                            pushes[0].file,
                            f"{img.repository} is pushed to {pushes[0].registry or 'no registry'}, "
                            "not to ECR (an amazon-ecr-login step's registry)",
                        )
                    )
                if img.tag_var and not any(_tag_matches(p.tag, img.tag_var) for p in pushes):
                    out.append(
                        Finding(
                            "images",
                            pushes[0].file,
                            f"{rt.where} runs {img.repository} at var.{img.tag_var}, but CI "
                            f"pushes it as {pushes[0].tag or 'no tag'} (expected "
                            f"${{IMAGE_TAG}} or ${{TF_VAR_{img.tag_var}}})",
                        )
                    )
    return out


def dockerfile_of(repo: Repo, mod: TfModule, image: str) -> str | None:
    """The Dockerfile an image of ``mod`` is built from (the first instance's that has
    one), or None (not from a declared ECR repository, or no Dockerfile found: the
    ``images`` rule's findings)."""
    resolved = _resolve_image(repo, mod, image)
    if isinstance(resolved, str):
        return None
    for img in resolved:
        for dockerfile in _dockerfiles_of(repo, img.repository)[:1]:
            return dockerfile
    return None


def image_code(repo: Repo, rt: Runtime, image: str) -> tuple[list[str], frozenset[str], str] | None:
    """The files the image starts for ``rt``, the variables its Dockerfile sets, and the
    Dockerfile; None when it runs no code of the repository we can find."""
    dockerfile = dockerfile_of(repo, rt.module, image)
    if dockerfile is None:
        return None
    parsed = parse_dockerfile(repo.files[dockerfile])
    entry = rt.entrypoint if rt.entrypoint is not None else parsed.entrypoint
    argv = entry + (rt.command if rt.command is not None else parsed.cmd)
    return entry_modules(repo.files, argv, parsed.lambda_base), parsed.env, dockerfile
