"""What ``srl collect --limit`` and ``srl data process --model`` decide, now in
``client/srl.py`` (issue 41): the task file cut before it is checked and stored, and whose
tokenizer counts tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.srl import token_model_spec, upload_tasks
from keel.llm import ModelsConfigError, UnknownModelError
from store.artifacts import LocalArtifactStore

MODELS = Path(__file__).resolve().parents[3] / "configs" / "models.yaml"


def test_upload_keeps_only_the_first_limit_lines(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "cas")
    lines = [
        json.dumps(
            {
                "task_id": f"t{i}",
                "instruction": "Rename the helper.",
                "language": "python",
                "file": "a.py",
                "pre": "x = 1\n",
                "post": "y = 1\n",
            }
        )
        + "\n"
        for i in range(3)
    ]
    # The third line is not a task: with limit=2 it is never read.
    data = "".join(lines[:2]).encode() + b"not json\n"
    digest, count = upload_tasks(store, data, None, limit=2)
    assert count == 2
    assert store.get_bytes(digest) == "".join(lines[:2]).encode()


def test_token_model_spec_named_default_and_unconfigured() -> None:
    named = token_model_spec(MODELS, "local")
    assert named is not None and named == token_model_spec(MODELS, None)
    with pytest.raises(UnknownModelError):
        token_model_spec(MODELS, "nosuchmodel")
    # No models config: the heuristic, unless a model was asked for by name.
    assert token_model_spec("/nonexistent/models.yaml", None) is None
    with pytest.raises(ModelsConfigError):
        token_model_spec("/nonexistent/models.yaml", "local")
