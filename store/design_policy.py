"""The organisation's design policy file (``configs/design/policy.yaml``,
``KEEL_DESIGN_POLICY``): read by the ``design.load`` activity for each run and by the API's
read-only view (``GET /design/policy``), so both say the same."""

from __future__ import annotations

from pathlib import Path

import yaml

from keel.design.policy import PolicySettings, policy_from_yaml


class PolicyFileError(ValueError):
    """The policy file is missing (when named), not YAML, or not the policy's fields."""


def read_policy(path: Path, *, missing_ok: bool) -> PolicySettings:
    """The policy in ``path``. ``missing_ok``: a missing file is the defaults (the default
    path); a file named on purpose that is missing is an error."""
    if not path.is_file():
        if missing_ok:
            return PolicySettings()
        raise PolicyFileError(f"the design policy {path} does not exist")
    try:
        return policy_from_yaml(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (ValueError, OSError, yaml.YAMLError) as exc:
        raise PolicyFileError(f"the design policy {path} is not usable: {exc}") from None
