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
"""

from __future__ import annotations

import ast
import re

from keel.design.wiring.code import _parsed, import_closure
from keel.design.wiring.images import runtimes
from keel.design.wiring.model import Finding
from keel.design.wiring.permissions import runtime_files
from keel.design.wiring.repo import Repo

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


def written_keys(path: str, text: str) -> set[str]:
    """The object keys ``text`` writes: literal or module-constant key arguments."""
    tree = _parsed(text)
    if tree is None:
        return set()
    consts = _constants(tree)
    out: set[str] = set()
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
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in consts:
            out.add(consts[arg.id])
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
    if not readers:
        return []
    for mod in repo.modules.values():
        for block in mod.of_kind("aws_s3_object"):
            key = block.body.get("key")
            if isinstance(key, str):
                terraform_keys.add(key)
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
    return out
