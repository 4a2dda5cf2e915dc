"""Rule ``objects``: every S3 object a runtime is handed to read has a writer in the design.

The readers are the model archives the Terraform hands out by URL (a SageMaker model's
``ModelDataUrl``, a schedule's ``model_data_url`` input, a runtime's ``MODEL_DATA_URL``):
``s3://<bucket>/<key>`` literals. A writer is either code a runtime of the Terraform runs
that writes the key under the ``DATA_URI`` it is given (``s3://<bucket>/<prefix>``: the
code writes ``<key>`` less ``<prefix>/`` through ``write_bytes``/``write_json``/...,
``put_object`` or ``upload_file``, the key a string literal or a module constant), or the
Terraform itself (an ``aws_s3_object``'s ``key``, a Step Functions state's S3
``PutObject``/``CopyObject`` ``Key``). Keys are compared, not buckets: a bucket handed
between modules (``var.model_bucket_arns``) is not followed. A generated repository had
the batch transform read ``registry/latest/model.tar.gz``, which only the smoke wrote.

A SageMaker training job's channel (an ``S3Uri`` of ``InputDataConfig``) reads a prefix:
some key under it must be written. Its writers are the Terraform's keys under it, and each
runtime whose code reads an environment variable the runtime sets to an
``s3://<bucket>/<prefix>`` literal and writes keys there: a literal, a module constant, or
the constant head of an f-string key (``f"raw/date={day}/..."``, also as the ``return``
of a function of the same file that makes the key), the variable's prefix joined to it.
A script job (a Glue job, an EMR Serverless job run: :mod:`.scripts`) is such a runtime
too: its script (what its ``script_location`` or ``EntryPoint`` uploads from the
repository) and what that imports, given the ``s3://`` literals of its arguments
(``default_arguments``, ``EntryPointArguments``) whose names (``--training_set_uri``:
``"training_set_uri"``) the script holds. A generated repository's training job read
``pipeline/training-sets/latest/``, which nothing deployed wrote.
"""

from __future__ import annotations

import ast
import re

from keel.design.wiring.code import _parsed, env_reads, import_closure
from keel.design.wiring.images import Runtime, runtimes
from keel.design.wiring.model import Finding
from keel.design.wiring.permissions import runtime_files
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import job_runs
from keel.design.wiring.terraform import _all_text, _balanced

#: The names under which the Terraform hands a runtime an object to read.
READ_NAMES = ("ModelDataUrl", "model_data_url", "MODEL_DATA_URL")
_S3 = r'"s3://(\$\{[^}]*\}|[^/"$]+)/([^"]*)"'
_READ = re.compile(r"\b(" + "|".join(READ_NAMES) + r")\b[^\n]*?" + _S3)
_DATA_URI = re.compile(r"\bDATA_URI\b[^\n]*?" + _S3)
_SFN_KEY = re.compile(r'\bKey\s*[=:]\s*"([^"$]+)"')
_SFN_S3_WRITE = re.compile(r"aws-sdk:s3:(?:putObject|copyObject)")
#: Calls that write an object, and the position of their key argument: a method of a
#: store (``store.write_bytes(key, ...)``) or a function taking the store first
#: (``write_json(store, key, ...)``).
_METHOD_WRITES = {"write_bytes": 0, "write_text": 0, "put_object": -1, "upload_file": 2}
_FUNCTION_WRITES = {"write_json": 1, "write_jsonl": 1, "write_bytes": 1}
#: A SageMaker job's channels, each ``S3Uri`` in them, and the channel's name.
_CHANNELS = re.compile(r'\bInputDataConfig"?\s*[=:]\s*([\[{])')
_CHANNEL_URI = re.compile(r'\bS3Uri"?\s*[=:]\s*' + _S3)
_CHANNEL_NAME = re.compile(r'\bChannelName"?\s*[=:]\s*"([^"]+)"')
#: An environment variable set to an ``s3://`` literal in a runtime's block: a JSON pair
#: (a Step Functions ``Environment``), a task definition's ``name``/``value``, or an HCL
#: map entry (a function's ``environment.variables``).
#: The literal's ``${...}`` parts may hold quotes (``${split(":::", var.arns[0])[1]}``).
_S3_LITERAL = r'"(s3://(?:\$\{[^}]*\}|[^"$])*)"'
_ENV_S3 = re.compile(
    r'"?\b([A-Z][A-Z0-9_]*)"?\s*[=:]\s*'
    + _S3_LITERAL
    + r'|"name"\s*:\s*"([A-Z][A-Z0-9_]*)"\s*,\s*"value"\s*:\s*'
    + _S3_LITERAL
)


def _constants(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            out[target.id] = value.value
    return out


def _key_args(tree: ast.Module) -> list[ast.expr]:
    """The key argument of each call in ``tree`` that writes an object."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        arg: ast.expr | None = None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _METHOD_WRITES:
            pos = _METHOD_WRITES[func.attr]
            kw = next((k.value for k in node.keywords if k.arg == "Key"), None)
            arg = kw if kw is not None else (node.args[pos] if 0 <= pos < len(node.args) else None)
        elif isinstance(func, ast.Name) and func.id in _FUNCTION_WRITES:
            pos = _FUNCTION_WRITES[func.id]
            arg = node.args[pos] if pos < len(node.args) else None
        if arg is not None:
            out.append(arg)
    return out


def written_keys(path: str, text: str) -> set[str]:
    """The object keys ``text`` writes: literal or module-constant key arguments."""
    tree = _parsed(text)
    if tree is None:
        return set()
    consts = _constants(tree)
    out: set[str] = set()
    for arg in _key_args(tree):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in consts:
            out.add(consts[arg.id])
    return out


def _head(node: ast.expr | None, consts: dict[str, str]) -> str | None:
    """The constant start of a key expression: a literal, a module constant, or an
    f-string's leading text (``f"raw/date={day}"``: ``raw/date=``); None when it has none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
            return first.value
    return None


def written_heads(path: str, text: str) -> set[str]:
    """The constant heads of the keys ``text`` writes (:func:`written_keys` and the heads
    of f-string keys), also through a call of a function of the file whose every
    ``return`` is such a key (``partition_key(day, source)``)."""
    tree = _parsed(text)
    if tree is None:
        return set()
    consts = _constants(tree)
    makers: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            returns = [r for r in ast.walk(node) if isinstance(r, ast.Return)]
            heads = {_head(r.value, consts) for r in returns}
            if returns and None not in heads and len(heads) == 1:
                makers[node.name] = str(heads.pop())
    out: set[str] = set()
    for arg in _key_args(tree):
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):
            head = makers.get(arg.func.id)
        else:
            head = _head(arg, consts)
        if head:
            out.add(head)
    return out


def parse_s3(uri: str) -> tuple[str, str] | None:
    """(bucket, key) of an ``s3://`` literal; the bucket may be a ``${...}`` expression."""
    m = re.fullmatch(r"s3://(\$\{[^}]*\}|[^/$]+)/?(.*)", uri)
    return (m.group(1), m.group(2)) if m else None


def env_s3(body: dict[str, object]) -> dict[str, str]:
    """The variables a runtime's block sets to an ``s3://`` literal (name -> literal): a
    function's or SageMaker model container's environment map, a state's ``Environment``
    or a task definition's ``name``/``value`` pairs."""
    out = {name: value for name, value in _env_values(body).items() if parse_s3(value)}
    for m in _ENV_S3.finditer(_all_text(body)):
        name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if parse_s3(value):
            out.setdefault(name, value)
    return out


def _env_uris(rt: Runtime) -> dict[str, str]:
    """The variables ``rt`` sets to an ``s3://`` literal, with the literal's key prefix."""
    out: dict[str, str] = {}
    for name, value in env_s3(rt.block.body).items():
        parsed = parse_s3(value)
        if parsed is not None and name in rt.env:
            out[name] = parsed[1].strip("/")
    return out


def _env_values(body: dict[str, object]) -> dict[str, str]:
    """A function's ``environment { variables = {...} }`` or a SageMaker model
    container's ``environment`` map, as the parser gives it."""
    out: dict[str, str] = {}
    candidates: list[object] = [body.get("environment")]
    for key in ("primary_container", "container"):
        cont = body.get(key)
        while isinstance(cont, list) and len(cont) == 1:
            cont = cont[0]
        if isinstance(cont, dict):
            candidates.append({"variables": cont.get("environment")})
    for env in candidates:
        while isinstance(env, list) and len(env) == 1:
            env = env[0]
        variables = env.get("variables") if isinstance(env, dict) else None
        if isinstance(variables, dict):
            out.update({str(k): str(v) for k, v in variables.items() if isinstance(v, str)})
    return out


def channel_readers(repo: Repo) -> list[tuple[str, int, str, str, str]]:
    """Each SageMaker channel's ``S3Uri`` literal: (file, line, channel, bucket, prefix)."""
    out: list[tuple[str, int, str, str, str]] = []
    for path in _tf_files(repo):
        text = repo.files[path]
        for m in _CHANNELS.finditer(text):
            start = m.start(1)
            span = _balanced(text, start)
            names = [(n.start(), n.group(1)) for n in _CHANNEL_NAME.finditer(span)]
            for u in _CHANNEL_URI.finditer(span):
                name = next((n for at, n in reversed(names) if at < u.start()), "?")
                line = text.count("\n", 0, start + u.start()) + 1
                out.append((path, line, name, u.group(1), u.group(2)))
    return out


def _under(key: str, prefix: str) -> bool:
    return key.startswith(prefix.rstrip("/") + "/")


def _runtime_writes(repo: Repo) -> list[tuple[str, str]]:
    """(runtime, key head) for every key head a runtime's code writes under a store URI
    it is given and reads: the variable's prefix joined to the head."""
    out: list[tuple[str, str]] = []
    for rt in runtimes(repo):
        uris = _env_uris(rt)
        if not uris:
            continue
        code = import_closure(repo.files, runtime_files(repo, rt))
        read = {r.name for path in code for r in env_reads(path, repo.files[path])}
        heads = {h for path in code for h in written_heads(path, repo.files[path])}
        for name in sorted(uris.keys() & read):
            prefix = uris[name]
            out += [(rt.where, f"{prefix}/{h}" if prefix else h) for h in sorted(heads)]
    return out


def _job_writes(repo: Repo) -> list[tuple[str, str]]:
    """(job, key head) for every key head a script job's script (a Glue job's
    ``script_location`` or an EMR job run's ``EntryPoint``, the repository file uploaded
    there, and what that imports) writes under an ``s3://`` argument it names
    (``--training_set_uri`` read as ``"training_set_uri"``)."""
    out: list[tuple[str, str]] = []
    for run in job_runs(repo):
        if run.script is None:
            continue
        tree = _parsed(repo.files[run.script])
        if tree is None:
            continue
        named = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        code = import_closure(repo.files, [run.script])
        heads = {h for path in code for h in written_heads(path, repo.files[path])}
        for name, value in sorted(run.args.items()):
            parsed = parse_s3(value)
            if parsed is None or name not in named:
                continue
            prefix = parsed[1].strip("/")
            out += [(run.where, f"{prefix}/{h}" if prefix else h) for h in sorted(heads)]
    return out


def _channel_findings(repo: Repo, terraform_keys: set[str]) -> list[Finding]:
    readers = channel_readers(repo)
    if not readers:
        return []
    writes = _runtime_writes(repo) + _job_writes(repo)
    out: list[Finding] = []
    for path, n, channel, bucket, prefix in readers:
        if any(_under(k, prefix) for k in terraform_keys):
            continue
        if any(_under(key, prefix) for _, key in writes):
            continue
        out.append(
            Finding(
                "objects",
                path,
                f"{path}:{n} the SageMaker channel {channel} reads s3://{bucket}/{prefix}, "
                "under which nothing in the design writes: no runtime's code writes a key "
                "there under an s3:// URI the Terraform gives it and it reads (the keys "
                f"runtimes write: {', '.join(sorted({k for _, k in writes})) or 'none'}), "
                "and no aws_s3_object or Step Functions S3 state puts one",
            )
        )
    return out


def _tf_files(repo: Repo) -> list[str]:
    return sorted(p for p in repo.files if p.endswith(".tf"))


def check_objects(repo: Repo) -> list[Finding]:
    readers: list[tuple[str, int, str, str, str]] = []
    prefixes: set[str] = set()
    terraform_keys: set[str] = set()
    for path in _tf_files(repo):
        text = repo.files[path]
        for n, line in enumerate(text.splitlines(), 1):
            for m in _READ.finditer(line):
                readers.append((path, n, m.group(1), m.group(2), m.group(3)))
            for m in _DATA_URI.finditer(line):
                prefixes.add(m.group(2).strip("/"))
        if _SFN_S3_WRITE.search(text):
            terraform_keys |= {m.group(1) for m in _SFN_KEY.finditer(text)}
    for mod in repo.modules.values():
        for block in mod.of_kind("aws_s3_object"):
            key = block.body.get("key")
            if isinstance(key, str):
                terraform_keys.add(key)
    channels = _channel_findings(repo, terraform_keys)
    if not readers:
        return channels
    code: set[str] = set()
    for rt in runtimes(repo):
        code.update(import_closure(repo.files, runtime_files(repo, rt)))
    keys = {k for path in sorted(code) for k in written_keys(path, repo.files[path])}
    written = set(terraform_keys)
    written |= {f"{p}/{k}" if p else k for p in prefixes for k in keys}
    out: list[Finding] = []
    for path, n, name, bucket, key in readers:
        if key in written:
            continue
        shown = ", ".join(sorted(keys)) or "none"
        out.append(
            Finding(
                "objects",
                path,
                f"{path}:{n} hands {name} s3://{bucket}/{key}, which nothing in the design "
                f"writes: no code a runtime runs writes it under a DATA_URI the Terraform "
                f"gives (prefixes: {', '.join(sorted(prefixes)) or 'none'}; keys the code "
                f"writes: {shown}), and no aws_s3_object or Step Functions S3 state puts it",
            )
        )
    return out + channels
