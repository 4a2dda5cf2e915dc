"""``mrp operators``: list, lint and sign the operators MRP jobs can use.

Mounted by ``cli/mrp.py`` as ``mrp operators``; runs alone as
``python -m cli.mrp_operators``. Every command reads ``configs/mrp.yaml`` (or
``--config``, or ``KEEL_MRP_CONFIG``) and the operators on its ``operator_paths``.
Output and errors as in every Keel CLI (``cli/toolkit.py``): text on a terminal, JSON
otherwise; failures in the envelope of family ``mrp`` (exit codes ``EXIT_CODES["mrp"]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit

if TYPE_CHECKING:
    from activities.mrp.operators import MrpConfig
    from cli.envelope import CliError

app = typer.Typer(
    help="MRP operators: list, lint and sign (docs/mrp-operators.md).",
    no_args_is_help=True,
    add_completion=False,
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="MRP config file (default: KEEL_MRP_CONFIG or configs/mrp.yaml)."
    ),
]
JsonOpt = toolkit.JsonOpt


def _translate(err: BaseException) -> CliError | None:
    """The operator registry's errors as ``mrp`` reports them (None: not one of them)."""
    from activities.mrp.operators import MrpConfigError
    from keel.mrp.errors import RegistryError

    if isinstance(err, MrpConfigError):
        return OPERATORS.failure("config", str(err), OPERATORS.exit_codes["error"]).error
    if isinstance(err, RegistryError):
        return OPERATORS.failure("refused", str(err)).error
    if isinstance(err, OSError):  # an unreadable key, a key file that exists already
        where = f"{err.filename}: " if err.filename else ""
        return OPERATORS.failure("error", f"{where}{err.strerror or err}").error
    return None


#: The toolkit's wrapper: ``mrp operators`` reports as the ``mrp`` family.
OPERATORS = toolkit.Family("mrp", _translate)


def _load(config: Path | None) -> MrpConfig:
    from activities.mrp.operators import load_mrp_config
    from keel.settings import Settings

    return load_mrp_config(Settings(), path=config)


def _short(digest: str | None) -> str:
    return "-" if not digest else digest.removeprefix("blake3:")[:12]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


@app.command("list")
def list_operators(config: ConfigOpt = None, as_json: JsonOpt = None) -> None:
    """Operators on the search path: name, version, kind, code digest, signer, allowed."""
    OPERATORS.mode(as_json)
    with OPERATORS.reported():
        _list(_load(config))


def _list(cfg: MrpConfig) -> None:
    records = []
    for e in cfg.entries:
        spec = e.spec
        records.append(
            {
                "name": spec.name if spec else e.ref,
                "version": spec.version if spec else "",
                "kind": spec.kind.value if spec else "",
                "code_digest": spec.code_digest if spec else None,
                "signed": spec is not None and spec.signature is not None,
                "signed_by": e.signed_by,
                "allowed": e.allowed,
                "status": "ok" if e.refusal is None else f"refused: {e.refusal.reason}",
                "folder": str(e.folder),
            }
        )
    rows = [
        [
            str(r["name"]),
            str(r["version"]),
            str(r["kind"]),
            _short(r["code_digest"] if isinstance(r["code_digest"], str) else None),
            str(r["signed_by"] or ("BAD" if r["signed"] else "no")),
            "yes" if r["allowed"] else "no",
            str(r["status"]),
        ]
        for r in records
    ]
    header = ["NAME", "VERSION", "KIND", "DIGEST", "SIGNED", "ALLOWED", "STATUS"]
    OPERATORS.emit({"config": str(cfg.path), "operators": records}, _table(rows, header))


@app.command("lint")
def lint(
    refs: Annotated[
        list[str] | None, typer.Argument(help="name@version to check (default: all).")
    ] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = None,
) -> None:
    """Check every operator: spec and schemas, entrypoint, code digest, signature,
    allow-list. Exits 1 when any error is found (the report is the output)."""
    OPERATORS.mode(as_json)
    with OPERATORS.reported():
        errors = _lint(_load(config), refs)
    if errors:
        raise typer.Exit(OPERATORS.exit_codes["error"])


def _lint(cfg: MrpConfig, refs: list[str] | None) -> int:
    from activities.mrp.operators import load_operator
    from keel.mrp.errors import RegistryError

    wanted = set(refs or [])
    problems: list[dict[str, str]] = []

    def add(ref: str, level: str, message: str) -> None:
        problems.append({"operator": ref, "level": level, "message": message})

    seen = set()
    for e in cfg.entries:
        if wanted and e.ref not in wanted:
            continue
        seen.add(e.ref)
        if e.refusal is not None:
            add(e.ref, "error", f"{e.refusal.reason}: {e.refusal.detail}")
            continue
        assert e.spec is not None
        if e.spec.signature is None:
            level = "error" if cfg.caps.require_signatures else "warning"
            add(e.ref, level, "unsigned (mrp operators sign --key KEY " + e.ref + ")")
        if not e.allowed:
            add(e.ref, "warning", e.allow_problem or "not on the allow-list")
        try:
            load_operator(e.spec, e.folder)
        except RegistryError as err:
            add(e.ref, "error", f"entrypoint: {err}")
        except Exception as err:
            add(e.ref, "error", f"entrypoint: importing it raised {type(err).__name__}: {err}")
    for ref in sorted(wanted - seen):
        add(ref, "error", "not found on the operator search path")
    if not wanted:
        known = {e.ref for e in cfg.entries}
        for entry in cfg.registry.allow:
            if entry.ref not in known:
                add(
                    entry.ref,
                    "error",
                    f"allow-listed in {cfg.path} but not found on the search path",
                )
    errors = sum(p["level"] == "error" for p in problems)
    text = [f"{p['level']}: {p['operator']}: {p['message']}" for p in problems]
    text.append(
        f"{len(seen)} operators checked, {errors} errors, {len(problems) - errors} warnings"
    )
    doc: dict[str, Any] = {"config": str(cfg.path), "problems": problems, "errors": errors}
    OPERATORS.emit(doc, "\n".join(text))
    return errors


@app.command("sign")
def sign(
    key: Annotated[Path, typer.Option("--key", "-k", help="ed25519 private key (PEM).")],
    all_: Annotated[
        bool, typer.Option("--all", help="Sign every operator on the search path.")
    ] = False,
    refs: Annotated[list[str] | None, typer.Argument(help="name@version to sign.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = None,
) -> None:
    """Recompute each operator's code digest, sign its spec with KEY, rewrite operator.yaml."""
    OPERATORS.mode(as_json)
    with OPERATORS.reported():
        _sign(key, all_, refs, config)


def _sign(key: Path, all_: bool, refs: list[str] | None, config: Path | None) -> None:
    from activities.mrp.operators import (
        MrpConfigError,
        load_private_key,
        public_key_hex,
        refuse_dev_key_in_prod,
        sign_operator,
    )
    from keel.settings import Settings

    if not refs and not all_:
        OPERATORS.fail("usage", "name operators to sign (name@version ...) or pass --all")
    settings = Settings()
    private = load_private_key(key)
    public = public_key_hex(private)
    refuse_dev_key_in_prod(public, settings.env, f"signing key {key}")
    cfg = _load(config)
    targets = [e for e in cfg.entries if all_ or e.ref in set(refs or [])]
    missing = sorted(set(refs or []) - {e.ref for e in cfg.entries})
    if missing:
        raise MrpConfigError(f"not found on the operator search path: {', '.join(missing)}")
    signed = []
    for e in targets:
        spec = sign_operator(e.folder, private)
        signed.append({"ref": spec.ref, "code_digest": spec.code_digest, "file": str(e.yaml_path)})
    trusted = public in cfg.trusted_keys.values()
    OPERATORS.emit(
        {"config": str(cfg.path), "public_key": public, "trusted": trusted, "signed": signed},
        "\n".join(f"signed {s['ref']}  {s['code_digest']}  ({s['file']})" for s in signed),
    )
    if not trusted:
        toolkit.note(
            f"note: key {public} is not in trusted_keys of {cfg.path}; "
            "operators it signs are refused until it is"
        )


@app.command("keygen")
def keygen(
    path: Annotated[Path, typer.Argument(help="Where to write the new private key (PEM).")],
    as_json: JsonOpt = None,
) -> None:
    """Create an ed25519 signing key; prints the trusted_keys line for configs/mrp.yaml."""
    from activities.mrp.operators import generate_key

    OPERATORS.mode(as_json)
    with OPERATORS.reported():
        public = generate_key(path)
    name = os.path.splitext(path.name)[0]
    OPERATORS.emit(
        {"key": str(path), "name": name, "public_key": public},
        f"wrote {path} (mode 0600); add to trusted_keys in configs/mrp.yaml:\n  {name}: {public}",
    )


def main(argv: list[str] | None = None) -> None:
    OPERATORS.main(app, argv)


if __name__ == "__main__":
    main()
