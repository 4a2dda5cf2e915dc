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

The package: :mod:`.files` (constants, refusals, the code digest, the folders),
:mod:`.keys` (keys, signatures, pins), :mod:`.config` (``configs/mrp.yaml``),
:mod:`.loading` (importing an operator's code) and :mod:`.invoke` (calling it).
"""

from __future__ import annotations

from activities.mrp.operators.config import (
    MrpConfig,
    MrpConfigFile,
    OperatorEntry,
    OperatorHandle,
    load_mrp_config,
    read_config_file,
    resolve_config_path,
)
from activities.mrp.operators.files import (
    DEV_KEY_ID,
    DEV_KEY_PATH,
    DEV_PUBLIC_KEY,
    OPERATOR_FILE,
    MrpConfigError,
    OperatorRefused,
    code_digest,
    find_operator_dir,
    scan_operators,
)
from activities.mrp.operators.invoke import (
    invoke_evaluate,
    invoke_map,
    invoke_map_arrow,
    invoke_produce,
    invoke_reduce,
    phase_handle,
    write_output,
)
from activities.mrp.operators.keys import (
    generate_key,
    load_private_key,
    public_key_hex,
    refuse_dev_key_in_prod,
    sign_operator,
    sign_spec,
    verify_signature,
    write_pins,
)
from activities.mrp.operators.loading import load_operator

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
    "invoke_map_arrow",
    "invoke_produce",
    "invoke_reduce",
    "load_mrp_config",
    "load_operator",
    "load_private_key",
    "phase_handle",
    "public_key_hex",
    "read_config_file",
    "refuse_dev_key_in_prod",
    "resolve_config_path",
    "scan_operators",
    "sign_operator",
    "sign_spec",
    "verify_signature",
    "write_output",
    "write_pins",
]
