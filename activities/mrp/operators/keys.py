"""Keys and signatures: ed25519 keys, signing a spec and verifying it, and the pins written
back into ``operator.yaml``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from activities.mrp.operators.files import (
    DEV_KEY_ID,
    DEV_PUBLIC_KEY,
    OPERATOR_FILE,
    MrpConfigError,
    _read_spec,
    code_digest,
)
from keel.mrp.registry import OperatorSpec

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )


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
