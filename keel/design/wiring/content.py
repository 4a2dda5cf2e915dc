"""Part of rule ``images``: a SageMaker batch transform sends what its model's code reads.

A transform job's ``TransformInput.ContentType`` (and ``TransformOutput.Accept``) is the
MIME type SageMaker sends to (and asks of) the model's ``/invocations``. The generated
Terraform sent ``text/csv`` while the code read JSON lines. The model's code is that of
the SageMaker models of the same module (their images' entry points and import closure);
a type is read there when it is a string literal of that code (``"application/jsonlines"``:
the handler compares or answers with it).
"""

from __future__ import annotations

import ast
import re

from keel.design.wiring.code import _parsed, import_closure
from keel.design.wiring.images import runtimes
from keel.design.wiring.model import Finding
from keel.design.wiring.permissions import runtime_files
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _json_objects, _json_values

_MIME = re.compile(r"^(?:application|text)/[A-Za-z0-9.+-]+$")


def mime_literals(text: str) -> set[str]:
    """The MIME types a Python file names as string literals."""
    tree = _parsed(text)
    if tree is None:
        return set()
    return {
        node.value.lower()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _MIME.match(node.value)
    }


def check_content_types(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    all_runtimes = runtimes(repo)
    for mod in repo.modules.values():
        for block in mod.of_kind("aws_sfn_state_machine"):
            text = _all_text(block.body.get("definition", ""))
            sent = [
                ("ContentType", v)
                for obj in _json_objects(text, "TransformInput")
                for _, v in _json_values(obj, ["ContentType"])
            ]
            sent += [
                ("Accept", v)
                for obj in _json_objects(text, "TransformOutput")
                for _, v in _json_values(obj, ["Accept"])
            ]
            if not sent:
                continue
            files: set[str] = set()
            for rt in all_runtimes:
                if rt.module is mod and rt.kind == "sagemaker":
                    files.update(import_closure(repo.files, runtime_files(repo, rt)))
            if not files:
                continue  # the images rule reports a model whose code is not found
            read: set[str] = set()
            for path in files:
                read |= mime_literals(repo.files[path])
            for field, mime in sent:
                if mime.lower() in read:
                    continue
                out.append(
                    Finding(
                        "images",
                        block.file,
                        f"aws_sfn_state_machine.{block.name}'s batch transform {field} is "
                        f"{mime}, which the model's code never names (it names: "
                        f"{', '.join(sorted(read)) or 'none'}): /invocations would get what "
                        "it does not read",
                    )
                )
    return out
