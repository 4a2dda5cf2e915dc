"""The SBOM: a CycloneDX SBOM of ``requirements.txt``, made before validation
(:func:`add_sbom`) and checked by it (:func:`check_sbom`)."""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from activities.design.codegen import check_paths
from activities.design.validators.host import _host
from activities.design.validators.jailed import _venv_bin
from keel.design.validation import ValidatorResult
from keel.design.wiring.images import normalised, pins_of

if TYPE_CHECKING:
    from cyclonedx.schema import SchemaVersion

log = logging.getLogger(__name__)


SBOM_PATH = "reports/sbom.cdx.json"


async def make_sbom(files: Mapping[str, str]) -> tuple[str | None, str]:
    """A CycloneDX SBOM of ``requirements.txt`` by ``cyclonedx-py`` (text, or None and why).

    It is made before validation and put in the tree (:func:`add_sbom`), so the SBOM that
    is checked is the one the archive ships.
    """
    if "requirements.txt" not in files:
        return None, "no requirements.txt"
    binary = _venv_bin("cyclonedx-py")
    if binary is None:
        return None, "cyclonedx-bom is not installed"
    with tempfile.TemporaryDirectory(prefix="keel-sbom-") as tmp:
        Path(tmp, "requirements.txt").write_text(files["requirements.txt"], encoding="utf-8")
        code, out, err = await _host(
            [
                binary,
                "requirements",
                "--of",
                "JSON",
                "--output-reproducible",
                # The sbom validator checks it against the schema (check_sbom); the tool's
                # own check was 2.2 of its 2.4 s of CPU, and the text is the same without.
                "--no-validate",
                "-o",
                "-",
                "requirements.txt",
            ],
            Path(tmp),
        )
    if code != 0:
        return None, f"cyclonedx-py requirements: exit {code}: {err.strip()[-300:]}"
    return (out if out.endswith("\n") else out + "\n"), ""


async def add_sbom(files: Mapping[str, str]) -> dict[str, str]:
    """``files`` with :data:`SBOM_PATH` made from ``requirements.txt`` when the tree has
    none; a tree that brings its own SBOM keeps it (and the sbom validator checks it)."""
    out = dict(files)
    if SBOM_PATH not in out:
        text, why = await make_sbom(out)
        if text is not None:
            out[SBOM_PATH] = text
        else:
            log.warning("no SBOM made: %s", why)
    return check_paths(out)


#: Where the CycloneDX schemas' ``$ref`` targets live (their ``$id`` prefix).
_SCHEMA_PREFIX = "http://cyclonedx.org/schema/"


@functools.cache
def _bom_validator(version: SchemaVersion) -> Any | None:
    """A Draft 7 validator (``jsonschema_rs``, formats asserted) of the CycloneDX JSON
    schema of ``version``, from the schema files cyclonedx-python-lib ships (the ones its
    own ``JsonStrictValidator`` reads); built once per version and process. None: the
    version has no JSON schema (1.0 and 1.1 are XML only).

    Not ``JsonStrictValidator`` itself: it rebuilt the schema on every call and checked
    the ``iri-reference`` URLs with ``rfc3987_syntax``'s Earley parser, 0.67 s of CPU a
    tree (1.96 s on a process's first) against 0.03 s to build this one and 2 ms to
    check (measured on the batch_training tree). Same verdicts on the schema's enums,
    references and formats (a bad IRI, an unknown licence id: checked both ways).
    """
    import jsonschema_rs
    from cyclonedx.schema._res import BOM_JSON_STRICT, CRYPTOGRAPHY_DEFS, JSF, SPDX_JSON

    path = BOM_JSON_STRICT.get(version)
    if path is None:
        return None
    registry = jsonschema_rs.Registry(
        [
            (_SCHEMA_PREFIX + Path(p).name, json.loads(Path(p).read_text(encoding="utf-8")))
            for p in (SPDX_JSON, JSF, CRYPTOGRAPHY_DEFS)
        ]
    )
    schema = json.loads(Path(path).read_text(encoding="utf-8"))
    return jsonschema_rs.Draft7Validator(schema, validate_formats=True, registry=registry)


def _schema_errors(bom: Any, spec: str) -> str | None:
    """The CycloneDX JSON schema's verdict on ``bom`` (None: valid): the first error,
    where it is and which rule it breaks."""
    from cyclonedx.schema import SchemaVersion

    try:
        version = SchemaVersion.from_version(spec)
    except (ValueError, KeyError):
        return f"unknown CycloneDX specVersion {spec!r}"
    validator = _bom_validator(version)
    if validator is None:
        return f"CycloneDX {spec} has no JSON schema (XML only)"
    error = next(iter(validator.iter_errors(bom)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.instance_path) or "(root)"
    return f"{where}: fails {error.kind.name}: {error.message[:300]}"


def check_sbom(files: Mapping[str, str]) -> ValidatorResult:
    """The tree's SBOM (:data:`SBOM_PATH`): present, CycloneDX JSON that its schema
    accepts, and naming every ``name==version`` pin of ``requirements.txt``."""
    if "requirements.txt" not in files:
        return ValidatorResult(name="sbom", status="not_run", summary="no requirements.txt")
    text = files.get(SBOM_PATH)
    if text is None:
        return ValidatorResult(
            name="sbom", status="failed", summary=f"no SBOM: {SBOM_PATH} is not in the tree"
        )
    try:
        bom = json.loads(text)
    except json.JSONDecodeError as exc:
        return ValidatorResult(
            name="sbom", status="failed", summary=f"the SBOM is not JSON: {exc.msg}"
        )
    if not isinstance(bom, dict) or bom.get("bomFormat") != "CycloneDX":
        return ValidatorResult(
            name="sbom", status="failed", summary="the SBOM is not a CycloneDX document"
        )
    spec = str(bom.get("specVersion", ""))
    invalid = _schema_errors(bom, spec)
    if invalid is not None:
        return ValidatorResult(
            name="sbom",
            status="failed",
            summary=f"the SBOM does not match the CycloneDX {spec} schema: {invalid}",
        )
    components = {
        (normalised(str(c.get("name"))), str(c.get("version")))
        for c in bom.get("components", [])
        if isinstance(c, dict)
    }
    pins = [(normalised(name), version) for _, name, version in pins_of(files["requirements.txt"])]
    missing = [f"{n}=={v}" for n, v in pins if (n, v) not in components]
    details = {
        "components": sorted(f"{n}=={v}" for n, v in components),
        "path": SBOM_PATH,
        "spec_version": spec,
    }
    if missing:
        return ValidatorResult(
            name="sbom",
            status="failed",
            summary=f"the SBOM misses {len(missing)} pinned requirement(s): "
            + ", ".join(missing[:10]),
            details={**details, "missing": missing},
        )
    return ValidatorResult(
        name="sbom",
        status="passed",
        summary=f"CycloneDX {spec} SBOM, {len(components)} components, "
        f"covers the {len(pins)} pins of requirements.txt",
        details=details,
    )
