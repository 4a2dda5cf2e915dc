"""Rule ``jobs``: every Glue script and EMR entry point is uploaded from the repository
(an EMR entry point wherever it is named: a state machine, the application, a schedule's
``StartJobRun`` input); every EMR Serverless application has a job run submitted to it
(:func:`keel.design.wiring.scripts.check_applications`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from keel.design.wiring.lambdas import archives, module_path
from keel.design.wiring.model import _BUCKET_REF, _S3_URI, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _json_values, _unwrap

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
    base, pattern = module_path(mod, root, m.group(1)), m.group(2)
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
    return _lookup(repo, mod, uri)[1]


def uploaded_file(repo: Repo, mod: TfModule, uri: str) -> str | None:
    """The repository file an ``aws_s3_object`` of ``mod`` uploads to ``uri``, or None."""
    return _lookup(repo, mod, uri)[0]


def _lookup(repo: Repo, mod: TfModule, uri: str) -> tuple[str | None, str | None]:
    """(the repository file uploaded to ``uri``, why it is not uploaded from the
    repository): one of them is None."""
    m = _S3_URI.match(uri)
    if m is None:
        return None, f"{uri} is not an S3 URI"
    bucket, key = m.group(1), m.group(2)
    ref = _BUCKET_REF.match(bucket)
    if ref is None:
        keys = [key] if "${" not in key else []
        if keys and any(key in r for r in repo.ci_runs):
            return None, None
        return None, f"{uri}: no aws_s3_object of this module and no CI step uploads it"
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
            pkgs = archives(repo, mod, source)
            if pkgs and any(p.root and any(p.holds(f) for f in repo.files) for p in pkgs):
                return None, None
            return None, f"{uri}: aws_s3_object.{obj.name} uploads an archive of no repository file"
        if not isinstance(source, str):
            return None, f"{uri}: aws_s3_object.{obj.name} has no source file"
        path = module_path(mod, roots_[0], source)
        if path in repo.files:
            return path, None
        return None, (
            f"{uri}: aws_s3_object.{obj.name} uploads {path}, which is not in the repository"
        )
    return None, f"{uri}: no aws_s3_object of {mod.dir}/ uploads key {key} to that bucket"


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
            elif block.kind in (
                "aws_sfn_state_machine",
                "aws_emrserverless_application",
                "aws_scheduler_schedule",
            ):
                text = _all_text(block.body)
                uris += [
                    v for _, v in _json_values(text, ["entryPoint", "EntryPoint", "ScriptLocation"])
                ]
            for uri in uris:
                why = _uploaded(repo, mod, uri)
                if why is not None:
                    out.append(Finding("jobs", block.file, f"{block.kind}.{block.name}: {why}"))
    return out
