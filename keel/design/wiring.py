"""Wiring (issue 38 §1): the pieces of a generated repository checked against each other.

Every other validator looks at one kind of file (the Terraform parses, the workflow lints,
the tests pass), so a repository can pass them all and still not deploy: a README that
passes a variable the root module does not declare, a Lambda function whose package
nothing builds, a task definition running an image nothing pushes, a service that reads
``DATA_URI`` from an environment nobody sets, an alarm on a metric nothing emits, a Glue
job whose script is not in the repository. :func:`check_wiring` reads the tree (Terraform
with python-hcl2, the CI workflows with PyYAML, Dockerfiles, the README's shell blocks and
the Python code with :mod:`ast`) and returns one :class:`Finding` per broken joint, each
naming the file and what is wrong. Pure: no I/O, the same tree always gets the same
findings.

The rules (:data:`RULES`):

``variables``
    every variable a README or CI command passes to Terraform (``-var``, ``-var-file``,
    ``TF_VAR_*``) is declared by the root module the command runs in; every input a
    ``module`` block passes is declared by that module; every variable of a module
    without a default is passed.
``lambda``
    every Lambda handler names a module file and a function that exist in the package,
    and the package is built from the repository (an ``archive_file`` data source, or a
    CI step that uploads the key the function reads), never a zip nothing makes.
``images``
    every image a task definition, SageMaker model or job (or a Lambda image) runs comes
    from an ECR repository the Terraform declares, is built by a CI workflow and pushed
    to that repository, under the repository's name and the tag variable the Terraform
    runs (the root variable ``image_tag`` is the CI's ``IMAGE_TAG`` or
    ``TF_VAR_image_tag``). Images AWS builds (``aws_sagemaker_prebuilt_ecr_image``) are
    accepted as they are.
``environment``
    every environment variable the code a runtime starts reads (``os.environ[...]``,
    ``os.environ.get``, ``os.getenv``, a name bound to ``os.environ``, fields of a
    pydantic ``BaseSettings``) is set by that runtime (task definition environment,
    Lambda environment, SageMaker ``Environment``, a compose file, the image's ``ENV``)
    unless its default works deployed: see :func:`default_works_deployed`.
``alarms``
    every CloudWatch alarm watches a metric something emits: an AWS namespace of a
    resource type the Terraform creates, a log metric filter on a log group some runtime
    writes to, or a custom metric the repository's code puts (same namespace, name and
    dimensions).
``jobs``
    every Glue job script (and ``--extra-py-files``) and EMR entry point is an object the
    Terraform uploads from a file of the repository.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import posixpath
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RULES = ("variables", "lambda", "images", "environment", "alarms", "jobs")

#: Set by the runtime itself, so code may read them without anything in the Terraform
#: setting them: Lambda and ECS on Fargate put the region in both names. SageMaker jobs
#: and models are not relied on for it: there the Terraform must set it.
RUNTIME_PROVIDED: dict[str, frozenset[str]] = {
    "lambda": frozenset(
        {
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_LAMBDA_FUNCTION_NAME",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            "AWS_LAMBDA_FUNCTION_VERSION",
            "AWS_EXECUTION_ENV",
            "LAMBDA_TASK_ROOT",
            "LAMBDA_RUNTIME_DIR",
        }
    ),
    "ecs": frozenset({"AWS_REGION", "AWS_DEFAULT_REGION", "ECS_CONTAINER_METADATA_URI_V4"}),
    "sagemaker": frozenset(),
    "compose": frozenset(),
}

#: Namespaces AWS emits metrics in, and the resource types whose presence means it does.
AWS_NAMESPACES: dict[str, tuple[str, ...]] = {
    "AWS/Lambda": ("aws_lambda_function",),
    "AWS/ECS": ("aws_ecs_service", "aws_ecs_cluster"),
    "ECS/ContainerInsights": ("aws_ecs_cluster",),
    "AWS/ApplicationELB": ("aws_lb", "aws_alb"),
    "AWS/States": ("aws_sfn_state_machine",),
    "AWS/Kinesis": ("aws_kinesis_stream",),
    "AWS/Firehose": ("aws_kinesis_firehose_delivery_stream",),
    "AWS/Kafka": ("aws_msk_cluster", "aws_msk_serverless_cluster"),
    "AWS/DynamoDB": ("aws_dynamodb_table",),
    "AWS/SQS": ("aws_sqs_queue",),
    "AWS/SNS": ("aws_sns_topic",),
    "AWS/S3": ("aws_s3_bucket",),
    "AWS/ApiGateway": ("aws_apigatewayv2_api", "aws_api_gateway_rest_api"),
    "AWS/AOSS": ("aws_opensearchserverless_collection",),
    "AWS/ES": ("aws_opensearch_domain", "aws_elasticsearch_domain"),
    "AWS/SageMaker": ("aws_sagemaker_endpoint", "aws_sfn_state_machine"),
    "/aws/sagemaker/TrainingJobs": ("aws_sfn_state_machine",),
    "/aws/sagemaker/TransformJobs": ("aws_sfn_state_machine",),
    "Glue": ("aws_glue_job",),
    "AWS/EMRServerless": ("aws_emrserverless_application",),
    "AWS/Events": ("aws_cloudwatch_event_rule",),
    "AWS/Scheduler": ("aws_scheduler_schedule",),
    "AWS/WAFV2": ("aws_wafv2_web_acl",),
    "AWS/EFS": ("aws_efs_file_system",),
    "AWS/Prometheus": ("aws_prometheus_workspace",),
}

#: Resource types whose reference to a log group means they write to it.
_LOG_WRITERS = (
    "aws_ecs_task_definition",
    "aws_lambda_function",
    "aws_sfn_state_machine",
    "aws_glue_job",
    "aws_apigatewayv2_stage",
    "aws_emrserverless_application",
)

_META_ARGS = frozenset({"source", "version", "providers", "count", "for_each", "depends_on"})
_IMAGE_KEYS = frozenset({"image", "image_uri", "Image", "TrainingImage", "ImageUri"})
_SCRIPT_KEYS = frozenset({"script_location", "ScriptLocation", "entryPoint", "EntryPoint"})
_ECR_IMAGE = re.compile(r"^\$\{aws_ecr_repository\.(\w+)\.repository_url\}:(.+)$")
_VAR_ONLY = re.compile(r"^\$\{var\.(\w+)\}$")
_VAR_REF = re.compile(r"\$\{var\.(\w+)\}")
_REF = re.compile(r"\b(data\.)?((?:aws|archive)_\w+)\.(\w+)")
_S3_URI = re.compile(r"^s3://(.+?)/(.+)$")
_BUCKET_REF = re.compile(r"^\$\{aws_s3_bucket\.(\w+)\.(?:id|bucket)\}$")
_STRING = r'"((?:[^"\\]|\\.)*)"'
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class Finding:
    """One broken joint: the rule, the file where it shows, and what is wrong."""

    rule: str
    file: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "file": self.file, "message": self.message}


# --------------------------------------------------------------------------- Terraform


@dataclass
class Variable:
    name: str
    file: str
    has_default: bool
    default: Any = None


@dataclass
class Block:
    kind: str  # resource type, data source type or module name
    name: str
    body: dict[str, Any]
    file: str


@dataclass
class TfModule:
    """The Terraform of one directory."""

    dir: str
    variables: dict[str, Variable] = field(default_factory=dict)
    modules: list[Block] = field(default_factory=list)
    resources: list[Block] = field(default_factory=list)
    data: list[Block] = field(default_factory=list)

    def resource(self, kind: str, name: str) -> Block | None:
        return next((r for r in self.resources if r.kind == kind and r.name == name), None)

    def datum(self, kind: str, name: str) -> Block | None:
        return next((d for d in self.data if d.kind == kind and d.name == name), None)

    def of_kind(self, *kinds: str) -> list[Block]:
        return [r for r in self.resources if r.kind in kinds]


@dataclass
class Instance:
    """A module as a root instantiates it: the module block's arguments, with a plain
    ``${var.x}`` resolved through its caller."""

    module: TfModule
    root: str
    args: dict[str, Any]
    block: Block | None  # None: the root itself


def _dirname(path: str) -> str:
    return posixpath.dirname(path) or "."


def _join(base: str, rel: str) -> str:
    joined = posixpath.normpath(posixpath.join(base, rel))
    return "." if joined in ("", ".") else joined


def _unwrap(value: Any) -> Any:
    """python-hcl2 wraps blocks in one-element lists."""
    while isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        value = value[0]
    return value


def parse_terraform(files: Mapping[str, str]) -> dict[str, TfModule]:
    """Every directory's Terraform (a file that does not parse is left out: the ``hcl``
    validator reports it)."""
    import hcl2

    modules: dict[str, TfModule] = {}
    for path in sorted(p for p in files if p.endswith(".tf")):
        try:
            doc = hcl2.loads(files[path])
        except Exception:  # lark raises several classes; the hcl validator names them
            continue
        mod = modules.setdefault(_dirname(path), TfModule(_dirname(path)))
        for block in doc.get("variable", []):
            for name, body in block.items():
                body = _unwrap(body) or {}
                mod.variables[name] = Variable(name, path, "default" in body, body.get("default"))
        for block in doc.get("module", []):
            for name, body in block.items():
                mod.modules.append(Block("module", name, _unwrap(body) or {}, path))
        for block in doc.get("resource", []):
            for kind, named in block.items():
                for name, body in named.items():
                    mod.resources.append(Block(kind, name, _unwrap(body) or {}, path))
        for block in doc.get("data", []):
            for kind, named in block.items():
                for name, body in named.items():
                    mod.data.append(Block(kind, name, _unwrap(body) or {}, path))
    return modules


def _callee(mod: TfModule, block: Block) -> str | None:
    source = block.body.get("source")
    if not isinstance(source, str) or not source.startswith(("./", "../")):
        return None
    return _join(mod.dir, source)


def _resolve(value: Any, args: Mapping[str, Any]) -> Any:
    """``value`` with each ``${var.x}`` whose argument is a plain string or number put in."""
    if isinstance(value, str):
        whole = _VAR_ONLY.match(value)
        if whole and whole.group(1) in args and not isinstance(args[whole.group(1)], str | int):
            return args[whole.group(1)]

        def put(m: re.Match[str]) -> str:
            got = args.get(m.group(1))
            if isinstance(got, bool) or not isinstance(got, str | int | float):
                return m.group(0)
            return str(got) if "${" not in str(got) else m.group(0)

        return _VAR_REF.sub(put, value)
    return value


def roots(modules: Mapping[str, TfModule]) -> list[str]:
    """Directories no module block calls: where ``terraform`` is run."""
    called = {c for m in modules.values() for b in m.modules if (c := _callee(m, b))}
    return sorted(d for d in modules if d not in called)


def instances(modules: Mapping[str, TfModule]) -> list[Instance]:
    """Every root and every module instance under it (depth-first, at most 8 deep)."""
    out: list[Instance] = []

    def walk(inst: Instance, depth: int) -> None:
        out.append(inst)
        if depth >= 8:
            return
        for block in inst.module.modules:
            callee = _callee(inst.module, block)
            if callee is None or callee not in modules:
                continue
            args = {k: _resolve(v, inst.args) for k, v in block.body.items() if k not in _META_ARGS}
            walk(Instance(modules[callee], inst.root, args, block), depth + 1)

    for root in roots(modules):
        walk(Instance(modules[root], root, {}, None), 0)
    return out


def _strings(value: Any) -> Iterator[tuple[str, str]]:
    """Every (key, string value) pair in a parsed body, at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                yield str(k), v
            else:
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, str):
                yield "", v
            else:
                yield from _strings(v)


def _all_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(v for _, v in _strings(value))


def _balanced(text: str, start: int) -> str:
    """The bracketed text that opens at ``text[start]``, strings skipped over."""
    pairs = {"{": "}", "[": "]", "(": ")"}
    stack: list[str] = []
    i, quoted = start, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return text[start : i + 1]
        i += 1
    return text[start:]


def _json_values(text: str, keys: Iterable[str]) -> list[tuple[str, str]]:
    """``"key": "value"`` pairs inside an encoded (``jsonencode``) expression."""
    names = "|".join(re.escape(k) for k in keys)
    return [(m.group(1), m.group(2)) for m in re.finditer(rf'"({names})"\s*:\s*{_STRING}', text)]


def _json_objects(text: str, key: str) -> list[str]:
    """The bracketed value of each ``"key": {...}`` / ``"key": [...]`` in ``text``."""
    out = []
    for m in re.finditer(rf'"{re.escape(key)}"\s*:\s*([\[{{])', text):
        out.append(_balanced(text, m.start(1)))
    return out


# ------------------------------------------------------------------------------- shell


@dataclass(frozen=True)
class TfCommand:
    """A ``terraform`` command in a README or CI step, with what it passes."""

    file: str
    cwd: str
    subcommand: str
    variables: tuple[str, ...]
    var_files: tuple[str, ...]
    env_vars: tuple[str, ...]


def _split_commands(line: str) -> list[list[str]]:
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = [[]]
    for tok in tokens:
        if tok and set(tok) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def _logical_lines(script: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for raw in script.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def shell_commands(
    script: str, cwd: str, env: Iterable[str] = ()
) -> tuple[list[tuple[str, list[str], tuple[str, ...]]], str]:
    """The commands of a shell script as (cwd, argv, TF_VAR names set), following ``cd``
    and ``export``; and the cwd it ends in."""
    exported = [e for e in env if e.startswith("TF_VAR_")]
    out: list[tuple[str, list[str], tuple[str, ...]]] = []
    for line in _logical_lines(script):
        for argv in _split_commands(line):
            assigned = []
            while argv and "=" in argv[0] and _ENV_NAME.match(argv[0].split("=", 1)[0]):
                assigned.append(argv.pop(0).split("=", 1)[0])
            if not argv:
                exported += [a for a in assigned if a.startswith("TF_VAR_")]
                continue
            if argv[0] == "export":
                exported += [
                    a.split("=", 1)[0] for a in argv[1:] if a.split("=", 1)[0].startswith("TF_VAR_")
                ]
                continue
            if argv[0] == "cd" and len(argv) > 1 and not argv[1].startswith(("$", "~", "/")):
                cwd = _join(cwd, argv[1])
                continue
            tf = tuple(
                dict.fromkeys([*exported, *(a for a in assigned if a.startswith("TF_VAR_"))])
            )
            out.append((cwd, argv, tf))
    return out, cwd


def terraform_command(
    file: str, cwd: str, argv: list[str], env: tuple[str, ...]
) -> TfCommand | None:
    """``argv`` as a :class:`TfCommand` (None: not terraform)."""
    if not argv or posixpath.basename(argv[0]) != "terraform":
        return None
    rest = argv[1:]
    while rest and rest[0].startswith("-chdir="):
        cwd = _join(cwd, rest.pop(0).split("=", 1)[1])
    sub = rest[0] if rest else ""
    variables: list[str] = []
    var_files: list[str] = []
    i = 1
    while i < len(rest):
        tok = rest[i]
        if tok in ("-var", "--var") and i + 1 < len(rest):
            variables.append(rest[i + 1].split("=", 1)[0].strip())
            i += 2
            continue
        if tok.startswith(("-var=", "--var=")):
            variables.append(tok.split("=", 1)[1].split("=", 1)[0].strip())
        elif tok in ("-var-file", "--var-file") and i + 1 < len(rest):
            var_files.append(rest[i + 1])
            i += 2
            continue
        elif tok.startswith(("-var-file=", "--var-file=")):
            var_files.append(tok.split("=", 1)[1])
        i += 1
    return TfCommand(
        file=file,
        cwd=cwd,
        subcommand=sub,
        variables=tuple(variables),
        var_files=tuple(var_files),
        env_vars=tuple(e.removeprefix("TF_VAR_") for e in env),
    )


_FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")


def readme_blocks(text: str) -> list[str]:
    """The shell blocks of a Markdown file (fences marked sh, bash, shell, console or
    nothing), each without its indentation."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).lower()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        if lang in ("", "sh", "bash", "shell", "console", "zsh"):
            blocks.append("\n".join(ln.removeprefix("$ ") for ln in body))
    return blocks


# ---------------------------------------------------------------------------------- CI


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


def ci_images(files: Mapping[str, str]) -> tuple[list[CiImage], list[TfCommand], set[str]]:
    """Images the CI workflows push, the terraform commands they run, and every text
    their ``run`` steps hold (for uploads)."""
    pushed: list[CiImage] = []
    commands: list[TfCommand] = []
    runs: set[str] = set()
    for path, doc in _workflows(files).items():
        jobs = doc.get("jobs")
        if not isinstance(jobs, dict):
            continue
        for job in jobs.values():
            if not isinstance(job, dict):
                continue
            steps = [s for s in job.get("steps") or [] if isinstance(s, dict)]
            ecr_steps = {
                str(s.get("id"))
                for s in steps
                if str(s.get("uses", "")).startswith("aws-actions/amazon-ecr-login")
            }
            defaults = job.get("defaults")
            run_defaults = defaults.get("run") if isinstance(defaults, dict) else None
            job_dir = (
                run_defaults.get("working-directory", ".")
                if isinstance(run_defaults, dict)
                else "."
            )
            for row in _matrix_rows(job):
                built: dict[str, str | None] = {}
                for step in steps:
                    env = _env_names(doc.get("env"), job.get("env"), step.get("env"))
                    uses = str(step.get("uses", ""))
                    if uses.startswith("docker/build-push-action"):
                        with_ = step.get("with")
                        if not isinstance(with_, dict):
                            with_ = {}
                        tags = _substitute(str(with_.get("tags", "")), row, ecr_steps)
                        dockerfile = _join(".", str(with_.get("file", "Dockerfile")))
                        for tag in re.split(r"[,\s]+", tags):
                            if tag and str(with_.get("push", "")).lower() == "true":
                                reg, repo, t = _split_ref(tag)
                                pushed.append(CiImage(path, reg, repo, t, dockerfile))
                        continue
                    run = step.get("run")
                    if not isinstance(run, str):
                        continue
                    text = _substitute(run, row, ecr_steps)
                    runs.add(text)
                    cwd = _join(".", str(step.get("working-directory", job_dir)))
                    for cdir, argv, tf_env in shell_commands(text, cwd, env)[0]:
                        cmd = terraform_command(path, cdir, argv, tf_env)
                        if cmd is not None:
                            commands.append(cmd)
                        elif argv[:2] == ["docker", "build"] or argv[:3] == [
                            "docker",
                            "buildx",
                            "build",
                        ]:
                            built_tags, built_file = _docker_builds(argv, cdir)
                            for tag in built_tags:
                                built[tag] = built_file
                            if "--push" in argv:
                                for tag in built_tags:
                                    pushed.append(CiImage(path, *_split_ref(tag), built_file))
                        elif argv[:2] == ["docker", "tag"] and len(argv) >= 4:
                            built[argv[3]] = built.get(argv[2])
                        elif argv[:2] == ["docker", "push"] and len(argv) >= 3:
                            ref = argv[-1]
                            pushed.append(CiImage(path, *_split_ref(ref), built.get(ref)))
    return pushed, commands, runs


# ------------------------------------------------------------------------------ Python


@dataclass(frozen=True)
class EnvRead:
    """An environment variable the code reads."""

    name: str
    file: str
    line: int
    default: str  # "none", or a description of the default
    accepted: bool  # the default works deployed


def default_works_deployed(node: ast.expr | None) -> tuple[str, bool]:
    """Whether an environment variable's default works where the code is deployed.

    Accepted: ``None`` (the code handles the variable's absence), a number or a bool, and
    a named constant of the code (``MIN_AUC``: the plan's value, the same wherever it
    runs). Not accepted: no default, and a string literal (a path such as ``"data"``, a
    host or a URL works on a developer's machine, not in a task, function or job), or any
    other expression (``REGIONS[0]`` is right in one region of several).
    """
    if node is None:
        return "none", False
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, bool | int | float):
            return repr(node.value), True
        return repr(node.value), False
    if isinstance(node, ast.Name | ast.Attribute):
        return ast.unparse(node), True
    return ast.unparse(node), False


def _is_environ(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "environ":
        return isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and (node.id in aliases or node.id == "environ")


def env_reads(path: str, text: str) -> list[EnvRead]:
    """The environment variables ``text`` (a Python file) reads, with their defaults."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            _is_environ(n, set()) for n in ast.walk(node.value)
        ):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    reads: list[EnvRead] = []

    def add(key: ast.expr, default: ast.expr | None, line: int) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            text_, ok = default_works_deployed(default)
            reads.append(EnvRead(key.value, path, line, text_, ok))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            default = node.args[1] if len(node.args) > 1 else None
            if default is None:
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(func, ast.Attribute) and (
                func.attr == "getenv" or (func.attr == "get" and _is_environ(func.value, aliases))
            ):
                add(node.args[0], default, node.lineno)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value, aliases)
        ):
            add(node.slice, None, node.lineno)
        elif isinstance(node, ast.ClassDef) and any(
            (isinstance(b, ast.Name) and b.id == "BaseSettings")
            or (isinstance(b, ast.Attribute) and b.attr == "BaseSettings")
            for b in node.bases
        ):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if stmt.target.id == "model_config":
                        continue
                    text_, ok = default_works_deployed(stmt.value)
                    reads.append(EnvRead(stmt.target.id.upper(), path, stmt.lineno, text_, ok))
    return reads


def module_file(files: Mapping[str, str], module: str, base: str = ".") -> str | None:
    """The repository file of a dotted module name under ``base`` (None: none)."""
    rel = module.replace(".", "/")
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        path = _join(base, cand)
        if path in files:
            return path
    return None


def import_closure(files: Mapping[str, str], start: Iterable[str]) -> list[str]:
    """The repository's Python files ``start`` (files) imports, transitively, with the
    packages' ``__init__`` files (an import string such as ``"pkg.app:app"`` counts)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen or path not in files:
            continue
        seen.add(path)
        parts = path.split("/")
        for i in range(1, len(parts)):
            init = "/".join(parts[:i]) + "/__init__.py"
            if init in files:
                todo.append(init)
        try:
            tree = ast.parse(files[path])
        except SyntaxError:
            continue
        package = ".".join(parts[:-1])
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", node.value)
            ):
                # An import string (``uvicorn.run("pkg.app:app")``) starts that module.
                names = [node.value.split(":", 1)[0]]
            for name in names:
                found = module_file(files, name)
                if found is not None:
                    todo.append(found)
    return sorted(seen)


def defines(text: str, name: str) -> bool:
    """Whether a Python file defines ``name`` at its top level."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        elif isinstance(node, ast.ImportFrom | ast.Import) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


@dataclass(frozen=True)
class Metric:
    """A custom metric the code puts."""

    namespace: str  # a regular expression (f-string parts are wildcards)
    name: str
    dimensions: frozenset[str]
    file: str


def _pattern(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+" for v in node.values
        )
    return None


def code_metrics(path: str, text: str) -> list[Metric]:
    """Metrics a file puts with ``put_metric_data`` (namespace, each datum's name and
    dimension names, from the literals in the file)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    namespaces = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "put_metric_data"
        ):
            for kw in node.keywords:
                if kw.arg == "Namespace" and (p := _pattern(kw.value)) is not None:
                    namespaces.append(p)
    if not namespaces:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        items = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        name = items.get("MetricName")
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        dims: set[str] = set()
        for sub in ast.walk(items["Dimensions"]) if "Dimensions" in items else ():
            if isinstance(sub, ast.Dict):
                for k, v in zip(sub.keys, sub.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "Name":
                        dims.add(str(v.value) if isinstance(v, ast.Constant) else "?")
        for ns in namespaces:
            out.append(Metric(ns, name.value, frozenset(map(str, dims)), path))
    return out


# ------------------------------------------------------------------------- Dockerfiles


@dataclass(frozen=True)
class Image:
    """What a Dockerfile runs: its argv (ENTRYPOINT then CMD) and the variables it sets."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: frozenset[str]
    lambda_base: bool


def _instruction_args(rest: str) -> tuple[str, ...]:
    """A Dockerfile instruction's arguments: its JSON (exec) form, else the shell form."""
    rest = rest.strip()
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            return ()
        return tuple(str(v) for v in value) if isinstance(value, list) else ()
    return ("sh", "-c", rest) if rest else ()


def parse_dockerfile(text: str) -> Image:
    entry: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: set[str] = set()
    lambda_base = False
    for line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, rest = stripped.partition(" ")
        word = word.upper()
        if word == "FROM":
            lambda_base = "lambda/python" in rest or "lambda/provided" in rest
        elif word == "ENTRYPOINT":
            entry = _instruction_args(rest)
        elif word == "CMD":
            cmd = _instruction_args(rest)
        elif word == "ENV":
            for m in re.finditer(r"(?:^|\s)([A-Za-z_]\w*)(?:=|\s)", rest):
                env.add(m.group(1))
                if "=" not in rest:
                    break
    return Image(entry, cmd, frozenset(env), lambda_base)


def entry_modules(
    files: Mapping[str, str], argv: tuple[str, ...], lambda_base: bool = False
) -> list[str]:
    """The repository files an argv starts (``python -m pkg``, ``python file.py``,
    ``uvicorn pkg.mod:app``, a Lambda base image's ``pkg.mod.handler``)."""
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "-m" and i + 1 < len(argv):
            found = module_file(files, argv[i + 1])
            main = module_file(files, argv[i + 1] + ".__main__")
            out += [p for p in (found, main) if p]
        elif tok.endswith(".py") and tok in files:
            out.append(tok)
        elif ":" in tok and not tok.startswith("-"):
            found = module_file(files, tok.split(":", 1)[0])
            if found:
                out.append(found)
    if lambda_base and len(argv) == 1 and "." in argv[0]:
        found = module_file(files, argv[0].rsplit(".", 1)[0])
        if found:
            out.append(found)
    return out


# ------------------------------------------------------------------------------ checks


@dataclass
class Repo:
    """Everything the checks read, parsed once."""

    files: Mapping[str, str]
    modules: dict[str, TfModule]
    instances: list[Instance]
    pushed: list[CiImage]
    ci_terraform: list[TfCommand]
    ci_runs: set[str]

    @classmethod
    def parse(cls, files: Mapping[str, str]) -> Repo:
        modules = parse_terraform(files)
        pushed, commands, runs = ci_images(files)
        return cls(files, modules, instances(modules), pushed, commands, runs)

    def resource_types(self) -> set[str]:
        return {r.kind for m in self.modules.values() for r in m.resources}

    def instances_of(self, mod: TfModule) -> list[Instance]:
        return [i for i in self.instances if i.module is mod]


def _readme_commands(files: Mapping[str, str]) -> list[TfCommand]:
    out = []
    for path in sorted(files):
        if not path.lower().endswith(".md"):
            continue
        for block in readme_blocks(files[path]):
            base = _dirname(path)
            for cwd, argv, env in shell_commands(block, base)[0]:
                cmd = terraform_command(path, cwd, argv, env)
                if cmd is not None:
                    out.append(cmd)
    return out


def _tfvars_keys(text: str) -> list[str] | None:
    import hcl2

    try:
        return list(hcl2.loads(text))
    except Exception:
        return None


def check_variables(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    mods = repo.modules
    for mod in mods.values():
        for block in mod.modules:
            callee_dir = _callee(mod, block)
            if callee_dir is None:
                continue
            callee = mods.get(callee_dir)
            if callee is None:
                out.append(
                    Finding(
                        "variables",
                        block.file,
                        f'module "{block.name}": its source {block.body.get("source")} '
                        f"({callee_dir}/) holds no Terraform",
                    )
                )
                continue
            passed = {k for k in block.body if k not in _META_ARGS}
            for key in sorted(passed - set(callee.variables)):
                out.append(
                    Finding(
                        "variables",
                        block.file,
                        f'module "{block.name}" passes {key}, which {callee_dir}/ does not declare',
                    )
                )
            for var in sorted(callee.variables.values(), key=lambda v: v.name):
                if not var.has_default and var.name not in passed:
                    out.append(
                        Finding(
                            "variables",
                            block.file,
                            f'module "{block.name}" does not pass {var.name}, which '
                            f"{var.file} declares without a default",
                        )
                    )
    for cmd in [*_readme_commands(repo.files), *repo.ci_terraform]:
        if cmd.subcommand not in ("plan", "apply", "destroy", "import", "refresh", "console"):
            continue
        root = mods.get(cmd.cwd)
        if root is None:
            out.append(
                Finding(
                    "variables",
                    cmd.file,
                    f"terraform {cmd.subcommand} runs in {cmd.cwd}/, which holds no Terraform",
                )
            )
            continue
        given = [(v, "-var") for v in cmd.variables] + [(v, "TF_VAR_") for v in cmd.env_vars]
        for var_file in cmd.var_files:
            path = _join(cmd.cwd, var_file)
            if path not in repo.files:
                out.append(
                    Finding(
                        "variables",
                        cmd.file,
                        f"terraform {cmd.subcommand} in {cmd.cwd}/ reads -var-file {var_file}, "
                        "which is not in the repository",
                    )
                )
                continue
            keys = _tfvars_keys(repo.files[path])
            given += [(k, f"-var-file {var_file}") for k in keys or ()]
        for name, how in given:
            if name not in root.variables:
                out.append(
                    Finding(
                        "variables",
                        cmd.file,
                        f"terraform {cmd.subcommand} in {cmd.cwd}/ passes {name} ({how}), "
                        f"which the root module {cmd.cwd}/ does not declare",
                    )
                )
    return out


def _refs(text: str) -> set[tuple[bool, str, str]]:
    return {(bool(m.group(1)), m.group(2), m.group(3)) for m in _REF.finditer(text)}


def _traces_to(mod: TfModule, start: Any, want: str, depth: int = 5) -> list[Block]:
    """The ``data.<want>`` blocks ``start``'s references reach within ``mod``."""
    found: list[Block] = []
    seen: set[tuple[bool, str, str]] = set()
    todo = [(r, depth) for r in _refs(_all_text(start))]
    while todo:
        ref, left = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        is_data, kind, name = ref
        block = mod.datum(kind, name) if is_data else mod.resource(kind, name)
        if block is None:
            continue
        if is_data and kind == want:
            found.append(block)
            continue
        if left > 0:
            todo += [(r, left - 1) for r in _refs(_all_text(block.body))]
    return found


def _module_path(mod: TfModule, root: str, expr: str) -> str:
    text = expr.replace("${path.module}", mod.dir).replace("${path.root}", root)
    text = text.replace("${path.cwd}", root)
    return _join(".", text)


@dataclass(frozen=True)
class Package:
    """Where a Lambda package comes from: an archive of ``root`` (minus ``excludes``)."""

    root: str
    excludes: tuple[str, ...]
    source: str

    def holds(self, path: str) -> bool:
        if self.root != "." and not path.startswith(self.root + "/"):
            return False
        rel = path if self.root == "." else path[len(self.root) + 1 :]
        return not any(
            rel == ex or rel.startswith(ex.rstrip("/") + "/") or fnmatch.fnmatch(rel, ex)
            for ex in self.excludes
        )


def _archives(repo: Repo, mod: TfModule, start: Any) -> list[Package]:
    out = []
    roots_ = sorted({i.root for i in repo.instances_of(mod)}) or [mod.dir]
    for block in _traces_to(mod, start, "archive_file"):
        body = block.body
        excludes = body.get("excludes") or []
        excl = tuple(str(e) for e in excludes) if isinstance(excludes, list) else ()
        if isinstance(body.get("source_dir"), str):
            path = _module_path(mod, roots_[0], body["source_dir"])
            out.append(Package(path, excl, f"data.archive_file.{block.name}"))
        elif isinstance(body.get("source_file"), str):
            path = _module_path(mod, roots_[0], body["source_file"])
            out.append(Package(_dirname(path), excl, f"data.archive_file.{block.name}"))
        else:
            out.append(Package("", excl, f"data.archive_file.{block.name}"))
    return out


def _defaults(mod: TfModule, repo: Repo, value: Any) -> list[str]:
    """``value`` resolved through each instance's arguments and the variables' defaults."""
    out = []
    for inst in repo.instances_of(mod) or [Instance(mod, mod.dir, {}, None)]:
        resolved = _resolve(value, inst.args)
        if isinstance(resolved, str):
            defaults = {k: v.default for k, v in mod.variables.items() if v.has_default}
            resolved = _resolve(resolved, {**defaults, **inst.args})
        out.append(str(resolved))
    return sorted(set(out))


def check_lambdas(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    for mod in repo.modules.values():
        for fn in mod.of_kind("aws_lambda_function"):
            where = f"aws_lambda_function.{fn.name}"
            if str(fn.body.get("package_type", "Zip")) == "Image":
                continue  # the images rule checks its image
            handler = str(fn.body.get("handler", ""))
            source = {k: fn.body.get(k) for k in ("filename", "s3_key", "s3_bucket")}
            packages = _archives(repo, mod, source)
            if not packages:
                keys = _defaults(mod, repo, fn.body.get("s3_key") or fn.body.get("filename"))
                uploaded = [k for k in keys if "${" not in k and any(k in r for r in repo.ci_runs)]
                if uploaded:
                    packages = [Package(".", (), f"a CI step uploading {uploaded[0]}")]
                else:
                    out.append(
                        Finding(
                            "lambda",
                            fn.file,
                            f"{where} runs the package "
                            f"{fn.body.get('s3_key') or fn.body.get('filename')} "
                            f"({', '.join(keys)}), which nothing builds: no archive_file data "
                            "source and no CI step makes or uploads it",
                        )
                    )
                    # The handler is still checked, against the repository's root.
                    packages = [Package(".", (), "the repository's root")]
            for pkg in packages:
                if not pkg.root or not any(pkg.holds(p) for p in repo.files):
                    out.append(
                        Finding(
                            "lambda",
                            fn.file,
                            f"{where}: {pkg.source} packages {pkg.root or 'nothing'}, which "
                            "holds no file of the repository",
                        )
                    )
                    continue
                if "." not in handler:
                    out.append(Finding("lambda", fn.file, f"{where}: no handler"))
                    continue
                module, func = handler.rsplit(".", 1)
                path = module_file(repo.files, module, pkg.root)
                if path is None or not pkg.holds(path):
                    rel = module.replace(".", "/")
                    out.append(
                        Finding(
                            "lambda",
                            fn.file,
                            f"{where}: handler {handler} names module {module}, but "
                            f"{_join(pkg.root, rel)}.py is not in its package ({pkg.source})",
                        )
                    )
                elif not defines(repo.files[path], func):
                    out.append(
                        Finding(
                            "lambda",
                            fn.file,
                            f"{where}: handler {handler}: {path} defines no {func}",
                        )
                    )
    return out


@dataclass(frozen=True)
class Runtime:
    """Something the Terraform starts that runs code: where it is declared, its kind
    (``ecs``, ``lambda``, ``sagemaker``), the images it runs and the variables it sets."""

    module: TfModule
    block: Block
    kind: str
    images: tuple[str, ...]
    env: frozenset[str]
    command: tuple[str, ...] | None = None
    handler: str | None = None

    @property
    def where(self) -> str:
        return f"{self.block.kind}.{self.block.name}"


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


def runtimes(repo: Repo) -> list[Runtime]:
    out: list[Runtime] = []
    for mod in repo.modules.values():
        for block in mod.resources:
            body = block.body
            if block.kind == "aws_ecs_task_definition":
                text = str(body.get("container_definitions", ""))
                images = tuple(v for _, v in _json_values(text, ["image"]))
                env: set[str] = set()
                for arr in [*_json_objects(text, "environment"), *_json_objects(text, "secrets")]:
                    env |= {v for _, v in _json_values(arr, ["name"])}
                command = None
                for arr in _json_objects(text, "command"):
                    command = tuple(re.findall(_STRING, arr))
                out.append(Runtime(mod, block, "ecs", images, frozenset(env), command))
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
                        handler=None if image else str(body.get("handler", "")),
                    )
                )
            elif block.kind == "aws_sfn_state_machine":
                text = str(body.get("definition", ""))
                for params in _json_objects(text, "Parameters"):
                    images = tuple(
                        v for _, v in _json_values(params, ["Image", "TrainingImage", "ImageUri"])
                    )
                    if not images:
                        continue
                    env = set()
                    for obj in _json_objects(params, "Environment"):
                        env |= _json_keys(obj)
                    out.append(Runtime(mod, block, "sagemaker", images, frozenset(env)))
            elif block.kind == "aws_sagemaker_model":
                for key in ("primary_container", "container"):
                    cont = _unwrap(body.get(key))
                    if isinstance(cont, dict) and cont.get("image"):
                        env_map = cont.get("environment")
                        names = frozenset(env_map) if isinstance(env_map, dict) else frozenset()
                        out.append(Runtime(mod, block, "sagemaker", (str(cont["image"]),), names))
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


def check_images(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    for rt in runtimes(repo):
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


def _image_code(
    repo: Repo, rt: Runtime, image: str
) -> tuple[list[str], frozenset[str], str] | None:
    """The files the image starts for ``rt``, the variables its Dockerfile sets, and the
    Dockerfile; None when it runs no code of the repository we can find."""
    resolved = _resolve_image(repo, rt.module, image)
    if isinstance(resolved, str):
        return None
    for img in resolved:
        dockerfiles = [
            p.dockerfile
            for p in repo.pushed
            if p.repository == img.repository and p.dockerfile in repo.files
        ]
        # Not pushed (the images rule says so): the Dockerfile of a directory named as the
        # repository's last segment (``<prefix>/serve``: ``services/serve/Dockerfile``).
        last = img.repository.rsplit("/", 1)[-1]
        dockerfiles += sorted(
            p for p in repo.files if p.endswith(f"/{last}/Dockerfile") or p == f"{last}/Dockerfile"
        )
        for dockerfile in dockerfiles[:1]:
            if dockerfile is not None:
                parsed = parse_dockerfile(repo.files[dockerfile])
                argv = parsed.entrypoint + (rt.command if rt.command is not None else parsed.cmd)
                return entry_modules(repo.files, argv, parsed.lambda_base), parsed.env, dockerfile
    return None


def _compose_runtimes(files: Mapping[str, str]) -> list[tuple[str, str, list[str], frozenset[str]]]:
    """(compose file, service, files it starts, variables it sets)."""
    import yaml

    out = []
    for path in sorted(files):
        if posixpath.basename(path) not in (
            "docker-compose.yml",
            "docker-compose.yaml",
            "compose.yml",
            "compose.yaml",
        ):
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
            out.append((path, str(name), starts, frozenset(names | parsed.env)))
    return out


def _missing_env(repo: Repo, starts: list[str], provided: frozenset[str]) -> list[EnvRead]:
    missing: dict[str, EnvRead] = {}
    for path in import_closure(repo.files, starts):
        for read in env_reads(path, repo.files[path]):
            if read.accepted or read.name in provided:
                continue
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
    for rt in runtimes(repo):
        provided = rt.env | RUNTIME_PROVIDED[rt.kind]
        if rt.handler:
            module = rt.handler.rsplit(".", 1)[0]
            for pkg in _archives(
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
            code = _image_code(repo, rt, image)
            if code is None:
                continue
            starts, image_env, dockerfile = code
            for read in _missing_env(repo, starts, provided | image_env):
                runs = " and ".join(starts) + f" ({dockerfile})"
                out.append(
                    Finding("environment", rt.block.file, _env_message(rt.where, runs, read))
                )
    for path, name, starts, provided in _compose_runtimes(repo.files):
        for read in _missing_env(repo, starts, provided):
            out.append(
                Finding(
                    "environment", path, _env_message(f"service {name}", ", ".join(starts), read)
                )
            )
    return out


def _could_be(pattern: str, value: str) -> bool:
    """Whether a code namespace pattern (a regex) may be ``value`` (Terraform text whose
    ``${...}`` parts are unknown)."""
    probe = re.sub(r"\$\{[^}]*\}", "x", value)
    if re.fullmatch(pattern, probe):
        return True
    literal = re.escape(value)
    loose = re.sub(r"\\\$\\\{.*?\\\}", ".+", literal)
    return bool(re.fullmatch(loose, pattern.replace("\\", "")))


def check_alarms(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    types = repo.resource_types()
    metrics = [
        m
        for path, text in sorted(repo.files.items())
        if path.endswith(".py") and not path.startswith("tests/")
        for m in code_metrics(path, text)
    ]
    for mod in repo.modules.values():
        writers = " ".join(_all_text(r.body) for r in mod.of_kind(*_LOG_WRITERS))
        for alarm in mod.of_kind("aws_cloudwatch_metric_alarm"):
            where = f"aws_cloudwatch_metric_alarm.{alarm.name}"
            watched: list[tuple[str, str, frozenset[str]]] = []
            body = alarm.body
            if body.get("metric_name"):
                dims = body.get("dimensions")
                watched.append(
                    (
                        str(body.get("namespace", "")),
                        str(body["metric_name"]),
                        frozenset(dims) if isinstance(dims, dict) else frozenset(),
                    )
                )
            queries = body.get("metric_query") or []
            for query in queries if isinstance(queries, list) else [queries]:
                for metric in (query.get("metric") or []) if isinstance(query, dict) else []:
                    metric = _unwrap(metric)
                    if isinstance(metric, dict) and metric.get("metric_name"):
                        dims = metric.get("dimensions")
                        watched.append(
                            (
                                str(metric.get("namespace", "")),
                                str(metric["metric_name"]),
                                frozenset(dims) if isinstance(dims, dict) else frozenset(),
                            )
                        )
            for namespace, name, dims in watched:
                if namespace in AWS_NAMESPACES or namespace.startswith("AWS/"):
                    kinds = AWS_NAMESPACES.get(namespace, ())
                    if not types & set(kinds):
                        out.append(
                            Finding(
                                "alarms",
                                alarm.file,
                                f"{where} watches {namespace} {name}, but the Terraform creates "
                                f"no {' or '.join(kinds) or 'resource that emits in ' + namespace}",
                            )
                        )
                    continue
                if _from_log_filter(mod, namespace, name, writers):
                    continue
                coded = [m for m in metrics if m.name == name and _could_be(m.namespace, namespace)]
                if any(m.dimensions == dims for m in coded):
                    continue
                if coded:
                    out.append(
                        Finding(
                            "alarms",
                            alarm.file,
                            f"{where} watches {namespace} {name} with dimensions "
                            f"{sorted(dims) or 'none'}, but {coded[0].file} puts it with "
                            f"{sorted(coded[0].dimensions) or 'none'}: no such metric exists",
                        )
                    )
                    continue
                out.append(
                    Finding(
                        "alarms",
                        alarm.file,
                        f"{where} watches {namespace} {name}, which nothing emits: no log "
                        "metric filter on a log group a runtime writes to, and no code puts it",
                    )
                )
    return out


def _from_log_filter(mod: TfModule, namespace: str, name: str, writers: str) -> bool:
    for filt in mod.of_kind("aws_cloudwatch_log_metric_filter"):
        tr = _unwrap(filt.body.get("metric_transformation"))
        if not isinstance(tr, dict) or tr.get("name") != name or tr.get("namespace") != namespace:
            continue
        group = re.match(
            r"^\$\{aws_cloudwatch_log_group\.(\w+)\.name\}$",
            str(filt.body.get("log_group_name", "")),
        )
        if group and f"aws_cloudwatch_log_group.{group.group(1)}." in writers:
            return True
    return False


_FILESET = re.compile(r'^\$\{fileset\("([^"]+)",\s*"([^"]+)"\)\}$')


def _glob(pattern: str) -> re.Pattern[str]:
    """A ``fileset`` pattern as a regular expression (``**/`` any directories, ``*`` within
    one)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _each(repo: Repo, mod: TfModule, root: str, body: Mapping[str, Any]) -> Sequence[str | None]:
    """The ``each.value`` of every instance of a block (``[None]``: no ``for_each``). A
    ``fileset`` over the repository is expanded; a literal file name stays, present or
    not, so that a missing file is named."""
    for_each = body.get("for_each")
    if for_each is None:
        return [None]
    m = _FILESET.match(str(for_each))
    if m is None:
        return []
    base, pattern = _module_path(mod, root, m.group(1)), m.group(2)
    if not any(ch in pattern for ch in "*?["):
        return [pattern]
    regex = _glob(pattern)
    prefix = "" if base == "." else base + "/"
    return sorted(
        p[len(prefix) :]
        for p in repo.files
        if p.startswith(prefix) and regex.fullmatch(p[len(prefix) :])
    )


def _each_put(value: Any, each: str | None) -> Any:
    if each is None or not isinstance(value, str):
        return value
    return value.replace("${each.value}", each).replace("${each.key}", each)


def _uploaded(repo: Repo, mod: TfModule, uri: str) -> str | None:
    """Why ``uri`` (an S3 URI in ``mod``) is not an object uploaded from the repository
    (None: it is)."""
    m = _S3_URI.match(uri)
    if m is None:
        return f"{uri} is not an S3 URI"
    bucket, key = m.group(1), m.group(2)
    ref = _BUCKET_REF.match(bucket)
    if ref is None:
        keys = [key] if "${" not in key else []
        if keys and any(key in r for r in repo.ci_runs):
            return None
        return f"{uri}: no aws_s3_object of this module and no CI step uploads it"
    roots_ = sorted({i.root for i in repo.instances_of(mod)}) or [mod.dir]
    for obj in mod.of_kind("aws_s3_object", "aws_s3_bucket_object"):
        if f"aws_s3_bucket.{ref.group(1)}." not in str(obj.body.get("bucket", "")):
            continue
        instances_ = _each(repo, mod, roots_[0], obj.body)
        match = next((v for v in instances_ if _each_put(obj.body.get("key"), v) == key), None)
        if match is None:
            continue
        source = _each_put(obj.body.get("source"), match)
        if isinstance(source, str) and "data.archive_file." in source:
            pkgs = _archives(repo, mod, source)
            if pkgs and any(p.root and any(p.holds(f) for f in repo.files) for p in pkgs):
                return None
            return f"{uri}: aws_s3_object.{obj.name} uploads an archive of no repository file"
        if not isinstance(source, str):
            return f"{uri}: aws_s3_object.{obj.name} has no source file"
        path = _module_path(mod, roots_[0], source)
        if path in repo.files:
            return None
        return f"{uri}: aws_s3_object.{obj.name} uploads {path}, which is not in the repository"
    return f"{uri}: no aws_s3_object of {mod.dir}/ uploads key {key} to that bucket"


def check_jobs(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    for mod in repo.modules.values():
        for block in mod.resources:
            uris: list[str] = []
            if block.kind == "aws_glue_job":
                command = _unwrap(block.body.get("command"))
                if isinstance(command, dict) and command.get("script_location"):
                    uris.append(str(command["script_location"]))
                args = block.body.get("default_arguments")
                if isinstance(args, dict):
                    for key in ("--extra-py-files", "--extra-files"):
                        if isinstance(args.get(key), str):
                            uris += [u for u in args[key].split(",") if u]
            elif block.kind in ("aws_sfn_state_machine", "aws_emrserverless_application"):
                text = _all_text(block.body)
                uris += [
                    v for _, v in _json_values(text, ["entryPoint", "EntryPoint", "ScriptLocation"])
                ]
            for uri in uris:
                why = _uploaded(repo, mod, uri)
                if why is not None:
                    out.append(Finding("jobs", block.file, f"{block.kind}.{block.name}: {why}"))
    return out


def check_wiring(files: Mapping[str, str]) -> list[Finding]:
    """Every rule's findings on ``files``, sorted (rule, file, message)."""
    repo = Repo.parse(files)
    found = [
        *check_variables(repo),
        *check_lambdas(repo),
        *check_images(repo),
        *check_environment(repo),
        *check_alarms(repo),
        *check_jobs(repo),
    ]
    return sorted(set(found), key=lambda f: (RULES.index(f.rule), f.file, f.message))


__all__ = [
    "AWS_NAMESPACES",
    "RULES",
    "RUNTIME_PROVIDED",
    "Finding",
    "check_wiring",
    "code_metrics",
    "default_works_deployed",
    "env_reads",
    "import_closure",
]
