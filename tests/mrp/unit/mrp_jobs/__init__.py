"""Sample MRP jobs, operator registry and service caps shared by the ``test_mrp_*`` tests.

- ``valid/``: jobs that compile under ``caps.yaml`` with ``registry.yaml``.
- ``invalid/pNNN_*.yaml``: one job per admission rule; header comments say which rule
  must fire (``# expect: RULE path``) and which caps to change (``# caps: {...}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from keel.mrp import AllowEntry, Caps, OperatorSpec, Registry

HERE = Path(__file__).parent


def load_registry() -> Registry:
    """The test registry from ``registry.yaml``."""
    data = yaml.safe_load((HERE / "registry.yaml").read_text())
    return Registry(
        operators=[OperatorSpec.model_validate(o) for o in data["operators"]],
        allow=[AllowEntry.parse(a) for a in data["allow"]],
    )


def load_caps(**overrides: Any) -> Caps:
    """The test caps from ``caps.yaml``, with ``overrides`` applied."""
    data = yaml.safe_load((HERE / "caps.yaml").read_text())
    data.update(overrides)
    return Caps.model_validate(data)


def job_text(name: str) -> str:
    """Text of ``valid/<name>`` or ``invalid/<name>`` (name includes the folder)."""
    return (HERE / name).read_text()


def invalid_jobs() -> list[Path]:
    """Every policy test job, sorted."""
    return sorted((HERE / "invalid").glob("p*.yaml"))
