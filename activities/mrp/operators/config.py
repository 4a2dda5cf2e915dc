"""The config file (``configs/mrp.yaml``): read, checked and turned into the registry of
operators a job compiles against."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from activities.mrp.operators.files import (
    _PUBLIC_KEY_RE,
    DEFAULT_CONFIG,
    MrpConfigError,
    OperatorRefused,
    ScannedOperator,
    scan_operators,
)
from activities.mrp.operators.keys import refuse_dev_key_in_prod, verify_signature
from activities.mrp.operators.loading import load_operator
from keel.digest import digest_json
from keel.mrp.errors import RegistryError
from keel.mrp.policy import Caps
from keel.mrp.registry import AllowEntry, OperatorSpec, Registry
from keel.mrp.sdk import (
    OperatorBase,
)
from keel.problems import problems

if TYPE_CHECKING:
    from keel.mrp.compiler import CompileResult
    from keel.mrp.normalize import FileRef
    from keel.mrp.records import RecordSlice
    from keel.settings import Settings


# The config file


class MrpConfigFile(BaseModel):
    """``configs/mrp.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operator_paths: list[str] = Field(
        default_factory=lambda: ["../operators"],
        description="Folders holding one operator per subfolder; relative to this file.",
    )
    trusted_keys: dict[str, str] = Field(
        default_factory=dict, description="key id -> raw ed25519 public key, hex."
    )
    allow: list[str] = Field(
        default_factory=list,
        description="Allow-list: name@version, optionally #blake3:<code digest>.",
    )
    caps: Caps = Field(default_factory=Caps)
    llm_model: str = Field(
        default="", description="Model (from the models config) operators get by default."
    )

    @field_validator("trusted_keys")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key_id, public_hex in v.items():
            if not _PUBLIC_KEY_RE.match(public_hex):
                raise ValueError(
                    f"trusted key {key_id!r} must be 64 lowercase hex digits (raw ed25519)"
                )
        return v


class OperatorHandle(BaseModel):
    """What a worker needs to run an operator: its spec and its folder (picklable, JSON).

    Ray tasks and thread workers receive handles and call :meth:`load`, which re-hashes
    the folder before importing (see :func:`load_operator`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: OperatorSpec
    folder: str

    def load(self) -> OperatorBase:
        """Import the operator (cached per process) and return its instance."""
        return load_operator(self.spec, self.folder)


@dataclass
class OperatorEntry:
    """An operator found on the search path, and what checking it concluded."""

    ref: str
    folder: Path
    yaml_path: Path
    spec: OperatorSpec | None
    actual_digest: str | None
    signed_by: str | None = None
    refusal: OperatorRefused | None = None
    allowed: bool = False
    allow_problem: str | None = None


@dataclass
class MrpConfig:
    """The loaded ``configs/mrp.yaml``: registry (accepted operators + allow-list), caps,
    trusted keys, where each operator lives, and which operators were refused and why."""

    path: Path
    registry: Registry
    caps: Caps
    trusted_keys: dict[str, str]
    search_paths: list[Path]
    entries: list[OperatorEntry]
    llm_model: str = ""
    refused: dict[str, OperatorRefused] = field(default_factory=dict)

    def entry(self, ref: str) -> OperatorEntry:
        """The entry of an accepted operator; :class:`OperatorRefused` or
        :class:`RegistryError` otherwise."""
        if ref in self.refused:
            raise self.refused[ref]
        for e in self.entries:
            if e.ref == ref and e.refusal is None:
                return e
        self.registry.get(ref)  # raises with the versions that do exist
        raise RegistryError(f"operator {ref} is not registered")

    def operator_dir(self, ref: str) -> Path:
        """The folder of an accepted operator."""
        return self.entry(ref).folder

    def handle(self, ref: str) -> OperatorHandle:
        """A picklable handle for workers."""
        e = self.entry(ref)
        assert e.spec is not None
        return OperatorHandle(spec=e.spec, folder=str(e.folder))

    def load(self, ref: str) -> OperatorBase:
        """Import an accepted operator and return its instance."""
        return self.handle(ref).load()

    def check_refs(self, refs: Iterable[str]) -> None:
        """Raise :class:`OperatorRefused` for the first of ``refs`` that was refused."""
        for ref in sorted(set(refs)):
            if ref in self.refused:
                raise self.refused[ref]

    def compile_job(
        self,
        yaml_text: str,
        *,
        resolved_files: Iterable[FileRef] | None = None,
        record_slices: Iterable[RecordSlice] | None = None,
        source: str = "",
    ) -> CompileResult:
        """:func:`keel.mrp.compile_job` against this registry and caps, after refusing any
        operator of the job whose code no longer matches its pin (or whose signature fails).
        """
        from keel.mrp.compiler import compile_parsed
        from keel.mrp.dsl import parse_job

        parsed = parse_job(yaml_text, source)
        self.check_refs(parsed.spec.operator_refs().values())
        return compile_parsed(
            parsed,
            self.registry,
            self.caps,
            resolved_files=resolved_files,
            record_slices=record_slices,
        )

    def digest(self) -> str:
        """Digest of what decides admission: registry, caps, trusted keys."""
        return digest_json(
            {
                "registry": self.registry.digest(),
                "caps": self.caps.digest(),
                "trusted_keys": self.trusted_keys,
            }
        )


def _check_entry(
    scanned: ScannedOperator, trusted_keys: dict[str, str], registry_allow: Registry
) -> OperatorEntry:
    spec = scanned.spec
    if spec is None:
        name = scanned.folder.name
        return OperatorEntry(
            ref=name,
            folder=scanned.folder,
            yaml_path=scanned.yaml_path,
            spec=None,
            actual_digest=scanned.actual_digest,
            refusal=OperatorRefused(name, "invalid_spec", scanned.error or "unreadable"),
        )
    entry = OperatorEntry(
        ref=spec.ref,
        folder=scanned.folder,
        yaml_path=scanned.yaml_path,
        spec=spec,
        actual_digest=scanned.actual_digest,
    )
    if scanned.actual_digest != spec.code_digest:
        entry.refusal = OperatorRefused(
            spec.ref,
            "code_mismatch",
            f"the code in {scanned.folder} has digest {scanned.actual_digest}, but "
            f"operator.yaml pins {spec.code_digest}; restore the code or re-sign it "
            "(mrp operators sign)",
        )
    elif spec.signature is not None:
        entry.signed_by = verify_signature(spec, trusted_keys)
        if entry.signed_by is None:
            entry.refusal = OperatorRefused(
                spec.ref,
                "bad_signature",
                "its signature does not verify with any trusted key "
                f"({', '.join(sorted(trusted_keys)) or 'none configured'})",
            )
    entry.allow_problem = registry_allow.allow_problem(spec)
    entry.allowed = entry.allow_problem is None
    return entry


def resolve_config_path(settings: Settings | None = None, path: str | Path | None = None) -> Path:
    """The config file: ``path``, else ``settings.mrp_config``, else ``configs/mrp.yaml``."""
    if path is not None:
        return Path(path)
    configured = getattr(settings, "mrp_config", None) if settings is not None else None
    return Path(configured) if configured else DEFAULT_CONFIG


def read_config_file(path: Path) -> MrpConfigFile:
    """Parse ``configs/mrp.yaml``; :class:`MrpConfigError` with the file named."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MrpConfigError(f"cannot read MRP config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise MrpConfigError(f"MRP config {path} is not valid YAML: {e}") from None
    try:
        return MrpConfigFile.model_validate(data or {})
    except ValidationError as e:
        raise MrpConfigError(f"MRP config {path}: {problems(e, root='<root>')}") from None


def load_mrp_config(
    settings: Settings | None = None, *, path: str | Path | None = None
) -> MrpConfig:
    """Load ``configs/mrp.yaml`` (or ``path``, or ``settings.mrp_config``) and every operator
    on its search path; see the module docstring for what is checked.

    Raises :class:`MrpConfigError` for a bad config file, or for a config that trusts the
    dev key when ``settings.env`` is ``prod``. Bad operators do not raise here: they are
    listed in :attr:`MrpConfig.refused` and refused when a job uses them.
    """
    config_path = resolve_config_path(settings, path)
    cfg = read_config_file(config_path)
    env = getattr(settings, "env", "dev") if settings is not None else "dev"
    for key_id, public_hex in cfg.trusted_keys.items():
        refuse_dev_key_in_prod(public_hex, env, f"trusted key {key_id!r} in {config_path}")
    try:
        allow = [AllowEntry.parse(text) for text in cfg.allow]
        allow_registry = Registry(allow=allow)
    except (ValidationError, ValueError) as e:
        raise MrpConfigError(f"MRP config {config_path}: bad allow-list: {e}") from None
    base = config_path.resolve().parent
    search_paths = [(base / p).resolve() for p in cfg.operator_paths]
    entries = [
        _check_entry(s, cfg.trusted_keys, allow_registry) for s in scan_operators(search_paths)
    ]
    # The same name@version in two folders: which one would run is a guess, so neither.
    by_ref: dict[str, list[OperatorEntry]] = {}
    for entry in entries:
        by_ref.setdefault(entry.ref, []).append(entry)
    for ref, group in by_ref.items():
        if len(group) > 1:
            where = ", ".join(str(g.folder) for g in group)
            for g in group:
                g.refusal = OperatorRefused(
                    ref, "duplicate", f"found in more than one folder: {where}"
                )
    refused = {e.ref: e.refusal for e in entries if e.refusal is not None}
    accepted = [e.spec for e in entries if e.refusal is None and e.spec is not None]
    registry = Registry(operators=accepted, allow=allow)
    return MrpConfig(
        path=config_path.resolve(),
        registry=registry,
        caps=cfg.caps,
        trusted_keys=dict(cfg.trusted_keys),
        search_paths=search_paths,
        entries=entries,
        llm_model=cfg.llm_model,
        refused=refused,
    )
