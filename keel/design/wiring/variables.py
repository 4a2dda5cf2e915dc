"""Rule ``variables``: every variable passed to Terraform is declared, every one without a default is passed."""

from __future__ import annotations

from collections.abc import Mapping

from keel.design.wiring.commands import TfCommand, readme_blocks, shell_commands, terraform_command
from keel.design.wiring.model import _META_ARGS, Block, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _callee, _dirname, _join, roots


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


_VAR_SUBCOMMANDS = ("plan", "apply", "destroy", "import", "refresh", "console")


def _check_module_call(mods: Mapping[str, TfModule], mod: TfModule, block: Block) -> list[Finding]:
    """Findings for one ``module`` block: its source exists, it passes only declared variables, it passes every required one."""
    callee_dir = _callee(mod, block)
    if callee_dir is None:
        return []
    callee = mods.get(callee_dir)
    if callee is None:
        return [
            Finding(
                "variables",
                block.file,
                f'module "{block.name}": its source {block.body.get("source")} '
                f"({callee_dir}/) holds no Terraform",
            )
        ]
    out: list[Finding] = []
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
    return out


def _given_variables(repo: Repo, cmd: TfCommand, out: list[Finding]) -> list[tuple[str, str]]:
    """The variables ``cmd`` passes, each with how it passes it; appends a finding per missing ``-var-file``."""
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
    return given


def _check_command(repo: Repo, cmd: TfCommand) -> list[Finding]:
    """Findings for one terraform command: it runs in a root module and passes only variables that root declares."""
    if cmd.subcommand not in _VAR_SUBCOMMANDS:
        return []
    root = repo.modules.get(cmd.cwd)
    if root is None:
        return [
            Finding(
                "variables",
                cmd.file,
                f"terraform {cmd.subcommand} runs in {cmd.cwd}/, which holds no Terraform",
            )
        ]
    out: list[Finding] = []
    given = _given_variables(repo, cmd, out)
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


def _auto_tfvars(repo: Repo, root: str) -> tuple[set[str], list[str]]:
    """The variables Terraform loads by itself in ``root`` (``terraform.tfvars``,
    ``*.auto.tfvars``, and their ``.json`` forms), and the files they come from."""
    import json

    keys: set[str] = set()
    files: list[str] = []
    for path in sorted(repo.files):
        if _dirname(path) != root:
            continue
        name = path.rsplit("/", 1)[-1]
        if name in ("terraform.tfvars", "terraform.tfvars.json") or name.endswith(
            (".auto.tfvars", ".auto.tfvars.json")
        ):
            if name.endswith(".json"):
                try:
                    doc = json.loads(repo.files[path])
                except ValueError:
                    continue
                found = list(doc) if isinstance(doc, dict) else []
            else:
                found = _tfvars_keys(repo.files[path]) or []
            keys |= set(found)
            files.append(path)
    return keys, files


def _check_required(repo: Repo, commands: list[TfCommand]) -> list[Finding]:
    """Every root variable without a default is given to every command that needs the
    variables (``plan``, ``apply`` without a saved plan, ...) in that root: by the command
    (``-var``, ``-var-file``, ``TF_VAR_*``) or by a tfvars file Terraform loads itself.
    Terraform run without it stops to ask (or, with ``-input=false``, fails)."""
    out: list[Finding] = []
    for root in roots(repo.modules):
        mod = repo.modules[root]
        required = sorted(
            (v for v in mod.variables.values() if not v.has_default), key=lambda v: v.name
        )
        if not required:
            continue
        auto, _ = _auto_tfvars(repo, root)
        runs = [
            c for c in commands
            if c.cwd == root and c.subcommand in _VAR_SUBCOMMANDS and c.plan_file is None
        ]  # fmt: skip
        if not runs:
            for var in required:
                if var.name in auto:
                    continue
                out.append(
                    Finding(
                        "variables",
                        var.file,
                        f"nothing passes {var.name}, which the root module {root}/ declares "
                        "without a default: no README or CI command plans or applies "
                        f"{root}/ and no tfvars file there sets it",
                    )
                )
            continue
        for cmd in runs:
            given = {name for name, _ in _given_variables(repo, cmd, [])} | auto
            for var in required:
                if var.name not in given:
                    out.append(
                        Finding(
                            "variables",
                            cmd.file,
                            f"terraform {cmd.subcommand} in {root}/ does not pass "
                            f"{var.name}, which the root module declares without a default "
                            f"({var.file}); no -var, -var-file, TF_VAR_ or tfvars file "
                            f"Terraform loads sets it",
                        )
                    )
    return out


def check_variables(repo: Repo) -> list[Finding]:
    """Rule ``variables``: check every module call, then every terraform command in READMEs
    and CI, then that every root variable without a default is given."""
    out: list[Finding] = []
    mods = repo.modules
    for mod in mods.values():
        for block in mod.modules:
            out += _check_module_call(mods, mod, block)
    commands = [*_readme_commands(repo.files), *repo.ci_terraform]
    for cmd in commands:
        out += _check_command(repo, cmd)
    out += _check_required(repo, commands)
    return out
