"""Settings that name paths: KEEL_MRP_OPERATOR_PATHS is a search path like PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from keel.settings import Settings


def test_mrp_operator_paths_split_like_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_MRP_OPERATOR_PATHS", os.pathsep.join(["/a/ops", "", "rel/ops"]))
    assert Settings().mrp_operator_paths == [Path("/a/ops"), Path("rel/ops")]
    monkeypatch.delenv("KEEL_MRP_OPERATOR_PATHS")
    assert Settings().mrp_operator_paths == []


def test_sandbox_settings_default_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEEL_SANDBOX_CONFIG", raising=False)
    monkeypatch.delenv("KEEL_NSJAIL_PATH", raising=False)
    s = Settings()
    assert s.sandbox_config is None and s.nsjail_path is None
    monkeypatch.setenv("KEEL_SANDBOX_CONFIG", "/etc/keel/sandbox.yaml")
    assert Settings().sandbox_config == Path("/etc/keel/sandbox.yaml")
