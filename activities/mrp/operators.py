"""Operators on disk: find them, hash their code, check pins and signatures, load the config,
and import and invoke their code (under the egress guard).

``configs/mrp.yaml`` (``KEEL_MRP_CONFIG``) names the folders to search for operators
(``operator_paths``), the trusted ed25519 public keys, the allow-list and the service's
:class:`~keel.mrp.policy.Caps`. :func:`load_mrp_config` reads it, finds every
``<path>/*/operator.yaml``, and for each operator:

1. parses the spec (:class:`~keel.mrp.registry.OperatorSpec`);
2. hashes the folder (:func:`code_digest`) and compares it with the spec's ``code_digest``
   (the *pin*): code changed after signing is refused;
3. verifies ``signature`` (if any) against the trusted keys: a signature no trusted key
   verifies is refused; an unsigned operator is registered as unsigned (policy rule
   MRP-P014 refuses it when the caps require signatures).

Refused operators stay out of the :class:`~keel.mrp.registry.Registry`;
:meth:`MrpConfig.compile_job` (what the compile activity calls) raises
:class:`OperatorRefused` naming the operator and the reason when a job uses one.

The dev signing key (``configs/keys/keel-dev.ed25519``) is in git, so anyone can sign with
it: with ``KEEL_ENV=prod`` a config that trusts it, and signing with it, are refused, the
same way ``Settings.check_secrets`` refuses the dev API tokens.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import blake3
import yaml
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator
from temporalio.exceptions import ApplicationError

from activities.mrp.egress import EgressDenied, egress_guard
from keel.digest import canonical_json, digest_bytes, digest_json
from keel.mrp.dsl import SinkSpec
from keel.mrp.errors import MrpError, RegistryError
from keel.mrp.ir import JobIR
from keel.mrp.policy import Caps
from keel.mrp.registry import AllowEntry, OperatorKind, OperatorSpec, Registry
from keel.mrp.run import ERROR_COMPILE
from keel.mrp.sdk import (
    AgentBase,
    Evaluation,
    EvaluatorBase,
    OperatorBase,
    OperatorContext,
    OperatorError,
    ProducedFile,
    ProducerBase,
    ProduceResult,
    ReducerBase,
    SchemaViolation,
    file_writer,
)
from keel.problems import problems

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from keel.mrp.compiler import CompileResult
    from keel.mrp.normalize import FileRef
    from keel.mrp.records import RecordSlice
    from keel.settings import Settings

__all__ = [
    "DEV_KEY_ID",
    "DEV_KEY_PATH",
    "DEV_PUBLIC_KEY",
    "OPERATOR_FILE",
    "MrpConfig",
    "MrpConfigError",
    "MrpConfigFile",
    "OperatorEntry",
    "OperatorHandle",
    "OperatorRefused",
    "code_digest",
    "find_operator_dir",
    "generate_key",
    "invoke_evaluate",
    "invoke_map",
    "invoke_produce",
    "invoke_reduce",
    "load_mrp_config",
    "load_operator",
    "load_private_key",
    "phase_handle",
    "public_key_hex",
    "scan_operators",
    "sign_operator",
    "sign_spec",
    "verify_signature",
    "write_output",
    "write_pins",
]

OPERATOR_FILE = "operator.yaml"
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = frozenset({".pyc", ".pyo"})
REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_OPERATORS = REPO_ROOT / "operators"
DEFAULT_CONFIG = REPO_ROOT / "configs" / "mrp.yaml"

# The development key pair. The private half is in git (configs/keys/), so operators signed
# with it prove nothing outside dev: KEEL_ENV=prod refuses to trust or use it.
DEV_KEY_ID = "keel-dev"
DEV_KEY_PATH = REPO_ROOT / "configs" / "keys" / "keel-dev.ed25519"
DEV_PUBLIC_KEY = "79e89199b863e52cd68ea682404b2bcafb5a040bf25fd2cca0ee7717e5f16ee8"

_PUBLIC_KEY_RE = re.compile(r"^[0-9a-f]{64}$")

RefusalReason = Literal[
    "invalid_spec", "code_mismatch", "bad_signature", "duplicate", "missing_folder"
]


class MrpConfigError(MrpError):
    """``configs/mrp.yaml`` is missing, malformed, or refused in this environment."""


class OperatorRefused(RegistryError):
    """An operator found on disk that must not run: its code no longer matches its pin, its
    signature does not verify, its spec is invalid, or it is found twice.

    ``operator`` is ``name@version`` (or the folder when the spec cannot be read),
    ``reason`` one of :data:`RefusalReason`.
    """

    def __init__(self, operator: str, reason: RefusalReason, detail: str) -> None:
        self.operator = operator
        self.reason = reason
        self.detail = detail
        super().__init__(f"operator {operator} is refused ({reason}): {detail}")


# ---------------------------------------------------------------------------------------
# Code digest and folders


def _code_files(root: Path) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts) or p.suffix in _SKIP_SUFFIXES:
            continue
        if rel.as_posix() == OPERATOR_FILE or not p.is_file():
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def code_digest(folder: str | Path) -> str:
    """``blake3:<hex>`` of an operator folder's code.

    BLAKE3 over every file but ``operator.yaml``, ``__pycache__`` and ``*.pyc``, in sorted
    relative-path order, each as (length-prefixed path, length-prefixed bytes), so moving
    bytes between files or renaming one changes the digest. The folder's own location does
    not count: a copy hashes the same.
    """
    root = Path(folder)
    if not root.is_dir():
        raise RegistryError(f"operator folder {root} does not exist")
    h = blake3.blake3()
    h.update(b"keel.mrp.operator-code/v1\0")
    for p in _code_files(root):
        rel = p.relative_to(root).as_posix().encode("utf-8")
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return "blake3:" + h.hexdigest()


@dataclass
class ScannedOperator:
    """One ``operator.yaml`` found on a search path, parsed or not."""

    yaml_path: Path
    folder: Path
    spec: OperatorSpec | None
    error: str | None = None
    actual_digest: str | None = None


def _read_spec(path: Path) -> OperatorSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    try:
        return OperatorSpec.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{path}: {problems(e, root='<root>')}") from None


def scan_operators(search_paths: Iterable[str | Path]) -> list[ScannedOperator]:
    """Every ``<path>/*/operator.yaml`` (one level deep), in path order then folder name,
    with its spec (or why it could not be read) and the digest of its code."""
    found: list[ScannedOperator] = []
    for base in search_paths:
        for yaml_path in sorted(Path(base).glob(f"*/{OPERATOR_FILE}")):
            folder = yaml_path.parent.resolve()
            try:
                spec: OperatorSpec | None = _read_spec(yaml_path)
                error = None
            except (OSError, ValueError) as e:
                spec, error = None, str(e)
            found.append(
                ScannedOperator(
                    yaml_path=yaml_path.resolve(),
                    folder=folder,
                    spec=spec,
                    error=error,
                    actual_digest=code_digest(folder),
                )
            )
    return found


def find_operator_dir(spec: OperatorSpec, search_paths: Iterable[str | Path] | None = None) -> Path:
    """The folder whose ``operator.yaml`` declares ``spec.ref``.

    The default search path is ``Settings.mrp_operator_paths`` (``KEEL_MRP_OPERATOR_PATHS``,
    ``os.pathsep``-separated) if set, else the shipped ``operators/`` folder. Callers that have an :class:`MrpConfig`
    use :meth:`MrpConfig.operator_dir` instead.
    """
    if search_paths is None:
        from keel.settings import Settings

        search_paths = list(Settings().mrp_operator_paths) or [SHIPPED_OPERATORS]
    for base in search_paths:
        for yaml_path in sorted(Path(base).glob(f"*/{OPERATOR_FILE}")):
            try:
                data = yaml.safe_load(yaml_path.read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError):
                continue
            if (
                isinstance(data, dict)
                and data.get("name") == spec.name
                and str(data.get("version")) == spec.version
            ):
                return yaml_path.parent.resolve()
    raise RegistryError(f"operator {spec.ref}: no folder with its operator.yaml on the search path")


# ---------------------------------------------------------------------------------------
# Keys and signatures


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An ed25519 private key from a PEM (PKCS#8) file, as ``openssl genpkey -algorithm
    ed25519`` or :func:`generate_key` writes it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise MrpConfigError(f"cannot read ed25519 private key {path}: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise MrpConfigError(f"{path} is not an ed25519 private key")
    return key


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key, hex (the form ``trusted_keys`` holds)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def generate_key(path: str | Path) -> str:
    """Write a new ed25519 private key (PEM, mode 0600) to ``path``; return its public key
    hex. Refuses to overwrite a file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return public_key_hex(key)


def refuse_dev_key_in_prod(public_hex: str, env: str, what: str) -> None:
    """:class:`MrpConfigError` when ``env`` is prod and ``public_hex`` is the dev key."""
    if env == "prod" and public_hex == DEV_PUBLIC_KEY:
        raise MrpConfigError(
            f"{what} is the dev signing key ({DEV_KEY_ID}), whose private half is public; "
            "use your own key outside dev (see docs/mrp-operators.md)"
        )


def sign_spec(spec: OperatorSpec, key: Ed25519PrivateKey) -> str:
    """The ed25519 signature (hex) over :meth:`OperatorSpec.signing_message`."""
    return key.sign(spec.signing_message()).hex()


def verify_signature(spec: OperatorSpec, trusted_keys: dict[str, str]) -> str | None:
    """The id of the trusted key whose signature ``spec`` carries, or None (unsigned, or
    no trusted key verifies it)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if spec.signature is None:
        return None
    signature = bytes.fromhex(spec.signature)
    message = spec.signing_message()
    for key_id, public_hex in sorted(trusted_keys.items()):
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex)).verify(signature, message)
        except (InvalidSignature, ValueError):
            continue
        return key_id
    return None


_DIGEST_LINE = re.compile(r"^code_digest:.*$", re.MULTILINE)
_SIGNATURE_LINE = re.compile(r"^signature:.*$", re.MULTILINE)


def write_pins(yaml_path: str | Path, digest: str, signature: str | None) -> None:
    """Rewrite the ``code_digest:`` and ``signature:`` lines of an ``operator.yaml`` (adding
    them at the end if absent), leaving every other line and comment as it was."""
    path = Path(yaml_path)
    text = path.read_text(encoding="utf-8")
    digest_line = f"code_digest: {digest}"
    if _DIGEST_LINE.search(text):
        text = _DIGEST_LINE.sub(digest_line, text, count=1)
    else:
        text = text.rstrip("\n") + "\n" + digest_line + "\n"
    if signature is None:
        text = _SIGNATURE_LINE.sub("", text).rstrip("\n") + "\n"
    elif _SIGNATURE_LINE.search(text):
        text = _SIGNATURE_LINE.sub(f"signature: {signature}", text, count=1)
    else:
        text = text.rstrip("\n") + "\n" + f"signature: {signature}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def sign_operator(folder: str | Path, key: Ed25519PrivateKey) -> OperatorSpec:
    """Recompute an operator's ``code_digest``, sign the spec, rewrite its ``operator.yaml``;
    return the signed spec (read back from the file, which proves the file parses)."""
    folder = Path(folder)
    yaml_path = folder / OPERATOR_FILE
    data = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise MrpConfigError(f"{yaml_path}: must be a YAML mapping")
    data["code_digest"] = code_digest(folder)
    data["signature"] = None
    try:
        unsigned = OperatorSpec.model_validate(data)
    except ValidationError as e:
        raise MrpConfigError(f"{yaml_path}: {e}") from None
    write_pins(yaml_path, unsigned.code_digest, sign_spec(unsigned, key))
    signed = _read_spec(yaml_path)
    if verify_signature(signed, {"k": public_key_hex(key)}) is None:
        raise MrpConfigError(f"{yaml_path}: the rewritten file does not verify (hand-edited?)")
    return signed


# ---------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------
# Loading operator code

_BASES: dict[OperatorKind, type[OperatorBase]] = {
    OperatorKind.MAP: AgentBase,
    OperatorKind.REDUCE: ReducerBase,
    OperatorKind.EVALUATE: EvaluatorBase,
    OperatorKind.PRODUCE: ProducerBase,
}


# ---------------------------------------------------------------------------------------
# Loading


_PACKAGE_ROOT = "keel_mrp_operators"
_load_lock = threading.RLock()
_loaded: dict[tuple[str, str, str], OperatorBase] = {}


def _package_name(spec: OperatorSpec, folder: Path) -> str:
    # One module namespace per (operator, code digest, folder): two versions of one
    # operator, or a changed copy of it, never share (or overwrite) a module.
    tag = hashlib.sha256(f"{spec.code_digest}\0{folder}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_]", "_", f"{spec.name}_{spec.version}")
    return f"{_PACKAGE_ROOT}.{safe}_{tag}"


def _import_package(name: str, folder: Path) -> None:
    if _PACKAGE_ROOT not in sys.modules:
        root = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec(_PACKAGE_ROOT, None, is_package=True)
        )
        root.__path__ = []
        sys.modules[_PACKAGE_ROOT] = root
    if name in sys.modules:
        return
    init = folder / "__init__.py"
    if init.is_file():
        mspec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )
    else:
        mspec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mspec.submodule_search_locations = [str(folder)]
    if mspec is None:
        raise RegistryError(f"cannot import operator code from {folder}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module
    try:
        if mspec.loader is not None:
            mspec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def load_operator(
    spec: OperatorSpec, folder: str | Path | None = None, *, verify: bool = True
) -> OperatorBase:
    """Import ``spec.entrypoint`` from the operator's folder and return an instance.

    ``folder`` is the directory holding the ``operator.yaml``; None looks the operator up
    on the default search path (:func:`find_operator_dir`). With
    ``verify`` the folder's code is hashed first and must match ``spec.code_digest``, so
    the code that runs is the code that was pinned and signed. Instances are cached per
    process (operators must not keep per-call state on ``self``).

    Raises :class:`~keel.mrp.errors.RegistryError` (code does not match its pin, module or
    class missing, wrong kind).
    """
    path = Path(folder).resolve() if folder is not None else find_operator_dir(spec)
    key = (spec.ref, spec.code_digest, str(path))
    with _load_lock:
        cached = _loaded.get(key)
        if cached is not None:
            return cached
        if verify:
            actual = code_digest(path)
            if actual != spec.code_digest:
                raise RegistryError(
                    f"operator {spec.ref}: code in {path} has digest {actual}, "
                    f"but its pin is {spec.code_digest}; re-sign it or restore the code"
                )
        module_rel, _, attr = spec.entrypoint.partition(":")
        package = _package_name(spec, path)
        try:
            _import_package(package, path)
            module = importlib.import_module(f"{package}.{module_rel}")
        except ImportError as e:
            raise RegistryError(
                f"operator {spec.ref}: cannot import {module_rel!r} from {path}: {e}"
            ) from None
        target = getattr(module, attr, None)
        if target is None:
            raise RegistryError(
                f"operator {spec.ref}: module {module_rel!r} has no attribute {attr!r}"
            )
        base = _BASES[spec.kind]
        if not (isinstance(target, type) and issubclass(target, base)):
            raise RegistryError(
                f"operator {spec.ref}: entrypoint {spec.entrypoint} must be a subclass of "
                f"{base.__name__} (kind {spec.kind.value})"
            )
        instance = target()
        _loaded[key] = instance
        return instance


# ---------------------------------------------------------------------------------------
# Invocation with schema checks and the egress guard


def _problems(spec: OperatorSpec, which: Literal["input", "output", "params"], v: Any) -> list[str]:
    out = []
    for p in spec.schema_errors(which, v):
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in p.path)
        out.append(f"{where.lstrip('.') or '<root>'}: {p.message}")
    return out


def _check(
    spec: OperatorSpec,
    which: Literal["input", "output", "params"],
    value: Any,
    label: str = "",
) -> None:
    problems = _problems(spec, which, value)
    if problems:
        if label:
            problems = [f"{label} {p}" for p in problems]
        # Bad output is the operator's fault, and a retry of a seeded operator gives the
        # same answer: no schema failure is retryable.
        raise SchemaViolation(spec.ref, which, problems)


def _check_json(spec: OperatorSpec, value: Any, what: str) -> None:
    try:
        canonical_json(value)
    except (TypeError, ValueError) as e:
        raise OperatorError(
            spec.ref, f"{what} is not canonical JSON: {e}", retryable=False
        ) from None


def _expect(spec: OperatorSpec, instance: OperatorBase, kind: OperatorKind) -> None:
    if spec.kind is not kind or not isinstance(instance, _BASES[kind]):
        raise OperatorError(
            spec.ref, f"is a {spec.kind.value} operator, not {kind.value}", retryable=False
        )


def _run(spec: OperatorSpec, fn: Callable[[], Any]) -> Any:
    try:
        with egress_guard(spec.ref, allowed=spec.egress):
            return fn()
    except OperatorError:
        raise
    except EgressDenied as e:
        # Policy, not bad luck: running it again would be refused again.
        raise OperatorError(spec.ref, str(e), retryable=False) from e
    except Exception as e:
        raise OperatorError(spec.ref, f"{type(e).__name__}: {e}") from e


def invoke_map(
    spec: OperatorSpec, instance: OperatorBase, items: list[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a map operator on one shard: params and every item checked against the schemas,
    the call guarded, the output checked against ``output_schema`` and canonical JSON."""
    _expect(spec, instance, OperatorKind.MAP)
    _check(spec, "params", ctx.params)
    for i, item in enumerate(items):
        _check(spec, "input", item, f"item {i}:")
    assert isinstance(instance, AgentBase)
    out = _run(spec, lambda: instance.map(items, ctx))
    _check_json(spec, out, "map output")
    _check(spec, "output", out)
    return out  # type: ignore[no-any-return]


def invoke_reduce(
    spec: OperatorSpec, instance: OperatorBase, outputs: list[JsonValue], ctx: OperatorContext
) -> JsonValue:
    """Run a reducer: each shard output checked against ``input_schema``, result against
    ``output_schema``."""
    _expect(spec, instance, OperatorKind.REDUCE)
    _check(spec, "params", ctx.params)
    for i, o in enumerate(outputs):
        _check(spec, "input", o, f"shard output {i}:")
    assert isinstance(instance, ReducerBase)
    out = _run(spec, lambda: instance.reduce(outputs, ctx))
    _check_json(spec, out, "reduce output")
    _check(spec, "output", out)
    return out  # type: ignore[no-any-return]


def invoke_evaluate(
    spec: OperatorSpec, instance: OperatorBase, reduced: JsonValue, ctx: OperatorContext
) -> Evaluation:
    """Run an evaluator on the reduced value (checked against ``input_schema``)."""
    _expect(spec, instance, OperatorKind.EVALUATE)
    _check(spec, "params", ctx.params)
    _check(spec, "input", reduced)
    assert isinstance(instance, EvaluatorBase)
    out = _run(spec, lambda: instance.evaluate(reduced, ctx))
    if not isinstance(out, Evaluation):
        raise OperatorError(spec.ref, "evaluate must return an Evaluation", retryable=False)
    return out


def invoke_produce(
    spec: OperatorSpec,
    instance: OperatorBase,
    reduced: JsonValue,
    sink: SinkSpec,
    out_dir: Path,
    ctx: OperatorContext,
) -> ProduceResult:
    """Run a producer: the sink kind must be one the operator writes; every listed file
    must exist under ``out_dir`` with the digest and size it claims."""
    _expect(spec, instance, OperatorKind.PRODUCE)
    if sink.kind not in spec.sinks:
        raise OperatorError(
            spec.ref,
            f"does not write {sink.kind.value} sinks (writes {spec.sinks})",
            retryable=False,
        )
    _check(spec, "params", ctx.params)
    _check(spec, "input", reduced)
    assert isinstance(instance, ProducerBase)
    out_dir.mkdir(parents=True, exist_ok=True)
    with file_writer(write_output):
        out = _run(spec, lambda: instance.produce(reduced, sink, out_dir, ctx))
    if not isinstance(out, ProduceResult):
        raise OperatorError(spec.ref, "produce must return a ProduceResult", retryable=False)
    for f in out.files:
        data = (out_dir / f.path).read_bytes()
        if digest_bytes(data) != f.digest or len(data) != f.size:
            raise OperatorError(
                spec.ref, f"file {f.path} does not match the digest/size it reported"
            )
    return out


def phase_handle(config: MrpConfig, ir: JobIR, role: str) -> OperatorHandle:
    """The operator of ``role``, refused unless its code is the code the IR was compiled
    with (a changed operator mid-run or since the original run fails here)."""
    binding = ir.operators[role]
    try:
        handle = config.handle(binding.ref)
    except RegistryError as e:
        raise ApplicationError(
            f"{role} operator {binding.ref} is refused: {e}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        ) from None
    if handle.spec.code_digest != binding.code_digest:
        raise ApplicationError(
            f"{role} operator {binding.ref}: its code is now {handle.spec.code_digest}, "
            f"but this run was compiled with {binding.code_digest}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        )
    return handle


def write_output(out_dir: Path, rel_path: str, data: bytes) -> ProducedFile:
    """Write ``data`` to ``out_dir/rel_path`` atomically (temp file + rename); return the
    :class:`ProducedFile` with its digest and size (what ``keel.mrp.sdk.write_output``
    does inside a produce call)."""
    produced = ProducedFile(path=rel_path, digest=digest_bytes(data), size=len(data))
    target = out_dir / rel_path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return produced
