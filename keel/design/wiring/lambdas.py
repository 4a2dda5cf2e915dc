"""Rule ``lambda``: every handler exists in a package the repository builds."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from keel.design.wiring.code import defines, module_file
from keel.design.wiring.images import image_command
from keel.design.wiring.model import _REF, Block, Finding, Instance, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _dirname, _join, _resolve

#: A Lambda handler as a base image's CMD names it: ``pkg.module.function``.
_HANDLER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def _refs(text: str) -> set[tuple[bool, str, str]]:
    return {(bool(m.group(1)), m.group(2), m.group(3)) for m in _REF.finditer(text)}


def _traces_to(mod: TfModule, start: Any, want: str, depth: int = 5) -> list[Block]:
    """The ``data.<want>`` blocks ``start``'s references reach within ``mod``."""
    found: list[Block] = []
    seen: set[tuple[bool, str, str]] = set()
    pending = [(r, depth) for r in _refs(_all_text(start))]
    while pending:
        ref, left = pending.pop()
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
            pending += [(r, left - 1) for r in _refs(_all_text(block.body))]
    return found


def module_path(mod: TfModule, root: str, expr: str) -> str:
    """A path expression of ``mod`` (``${path.module}``, ``${path.root}``, ``${path.cwd}``)
    as a repository path, the root module at ``root``."""
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


def archives(repo: Repo, mod: TfModule, start: Any) -> list[Package]:
    """The ``archive_file`` packages the value ``start`` of ``mod`` (a function's
    ``filename``/``s3_key``, a Glue script's source) traces to; empty when none."""
    out = []
    roots_ = sorted({i.root for i in repo.instances_of(mod)}) or [mod.dir]
    for block in _traces_to(mod, start, "archive_file"):
        body = block.body
        excludes = body.get("excludes") or []
        excl = tuple(str(e) for e in excludes) if isinstance(excludes, list) else ()
        if isinstance(body.get("source_dir"), str):
            path = module_path(mod, roots_[0], body["source_dir"])
            out.append(Package(path, excl, f"data.archive_file.{block.name}"))
        elif isinstance(body.get("source_file"), str):
            path = module_path(mod, roots_[0], body["source_file"])
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


def _image_handler(repo: Repo, fn: Block, where: str) -> list[Finding]:
    """A Lambda base image's handler set by ``image_config { command = ["pkg.mod.func"] }``:
    the module is a file of the repository and defines the function."""
    command = image_command(fn.body)
    if command is None or len(command) != 1 or not _HANDLER.fullmatch(command[0]):
        return []
    module, func = command[0].rsplit(".", 1)
    path = module_file(repo.files, module)
    if path is None:
        rel = module.replace(".", "/")
        return [
            Finding(
                "lambda",
                fn.file,
                f"{where}: image_config command {command[0]} names module {module}, but "
                f"{rel}.py is not in the repository",
            )
        ]
    if not defines(repo.files[path], func):
        return [
            Finding(
                "lambda",
                fn.file,
                f"{where}: image_config command {command[0]}: {path} defines no {func}",
            )
        ]
    return []


def _zip_packages(
    repo: Repo, mod: TfModule, fn: Block, where: str
) -> tuple[list[Package], list[Finding]]:
    """The packages a Zip Lambda runs: its archive_file sources, else a CI step uploading its
    key; with neither, a finding and the repository's root (the handler is still checked)."""
    source = {k: fn.body.get(k) for k in ("filename", "s3_key", "s3_bucket")}
    packages = archives(repo, mod, source)
    if packages:
        return packages, []
    keys = _defaults(mod, repo, fn.body.get("s3_key") or fn.body.get("filename"))
    uploaded = [k for k in keys if "${" not in k and any(k in r for r in repo.ci_runs)]
    if uploaded:
        return [Package(".", (), f"a CI step uploading {uploaded[0]}")], []
    finding = Finding(
        "lambda",
        fn.file,
        f"{where} runs the package "
        f"{fn.body.get('s3_key') or fn.body.get('filename')} "
        f"({', '.join(keys)}), which nothing builds: no archive_file data "
        "source and no CI step makes or uploads it",
    )
    # The handler is still checked, against the repository's root.
    return [Package(".", (), "the repository's root")], [finding]


def _check_package(repo: Repo, fn: Block, where: str, handler: str, pkg: Package) -> Finding | None:
    """The finding, if any, for one package of a Zip Lambda: it holds files of the repository,
    and the handler's module is in it and defines the handler's function."""
    if not pkg.root or not any(pkg.holds(p) for p in repo.files):
        return Finding(
            "lambda",
            fn.file,
            f"{where}: {pkg.source} packages {pkg.root or 'nothing'}, which "
            "holds no file of the repository",
        )
    if "." not in handler:
        return Finding("lambda", fn.file, f"{where}: no handler")
    module, func = handler.rsplit(".", 1)
    path = module_file(repo.files, module, pkg.root)
    if path is None or not pkg.holds(path):
        rel = module.replace(".", "/")
        return Finding(
            "lambda",
            fn.file,
            f"{where}: handler {handler} names module {module}, but "
            f"{_join(pkg.root, rel)}.py is not in its package ({pkg.source})",
        )
    if not defines(repo.files[path], func):
        return Finding(
            "lambda",
            fn.file,
            f"{where}: handler {handler}: {path} defines no {func}",
        )
    return None


def check_lambdas(repo: Repo) -> list[Finding]:
    """Rule ``lambda``: every Lambda function's handler exists in a package the repository builds."""
    out: list[Finding] = []
    for mod in repo.modules.values():
        for fn in mod.of_kind("aws_lambda_function"):
            where = f"aws_lambda_function.{fn.name}"
            if str(fn.body.get("package_type", "Zip")) == "Image":
                # The images rule checks its image; a handler named in image_config must
                # exist in the code the image copies (the repository's packages).
                out += _image_handler(repo, fn, where)
                continue
            handler = str(fn.body.get("handler", ""))
            packages, findings = _zip_packages(repo, mod, fn, where)
            out += findings
            for pkg in packages:
                finding = _check_package(repo, fn, where, handler, pkg)
                if finding is not None:
                    out.append(finding)
    return out
