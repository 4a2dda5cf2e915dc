"""ECS or Lambda serving in a SageMaker training plan loads what the training publishes.

Serving read ``registry/production.json`` under its ``DATA_URI`` (the models bucket's
``pipeline/``), which no deployed training wrote: the network-isolated SageMaker job
writes ``/opt/ml/model``, and the training state machine's Publish copies that
``model.tar.gz`` to ``pipeline/registry/latest/model.tar.gz``. Now serving falls back to
that archive (the generated ``ModelHolder``), and the names agree end to end: the
serving module's bucket and prefix, the state machine's key, and the code's constant.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from activities.design.infra import DATA_PREFIX, MODEL_ARCHIVE_KEY
from tests.design.unit.test_wiring import tree
from tests.support.hcl import parse_once

#: MSK, Lambda transform, SageMaker training, ECS serving.
SHAPE = "streaming_features"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


def test_ecs_serving_reads_the_archive_the_state_machine_publishes() -> None:
    files = tree(SHAPE)
    root = files["infra/main.tf"]
    # Serving's DATA_URI is the train module's models bucket under DATA_PREFIX ...
    region = re.search(r'module "serve_(\w+)"', root)
    assert region is not None
    r = region.group(1)
    assert f"model_bucket_arns       = module.train_{r}.data_bucket_arns" in root
    assert (
        'environment            = [{ name = "DATA_URI", value = "s3://${split(":::", '
        f'var.model_bucket_arns[0])[1]}}/{DATA_PREFIX}" }}]'
    ) in files["infra/modules/serve/main.tf"]
    assert "value       = [aws_s3_bucket.models.arn]" in files["infra/modules/train/outputs.tf"]
    # ... where Publish copies the job's archive, under the key the code names.
    train = files["infra/modules/train/main.tf"]
    assert 'Resource = "arn:aws:states:::aws-sdk:s3:copyObject"' in train
    assert f'Key                  = "{DATA_PREFIX}/{MODEL_ARCHIVE_KEY}"' in train
    registry = files["services/common/registry.py"]
    assert f'MODEL_ARCHIVE = "{MODEL_ARCHIVE_KEY}"' in registry
    assert "def archive_files(data: bytes) -> dict[str, bytes]:" in registry
    loader = files["services/serve/loader.py"]
    assert "        if version is None:\n            return self._refresh_from_archive()" in loader
    assert "data = self.store.read_bytes(MODEL_ARCHIVE)" in loader
    assert (
        "test_serving_loads_the_archive_the_training_state_machine_publishes"
        in files["tests/test_train.py"]
    )


@pytest.mark.parametrize("name", ["batch_training", "kinesis_online_one_region"])
def test_serving_beside_other_training_reads_the_registry_entry(name: str) -> None:
    """ECS training writes the registry entry under the same DATA_URI: no fallback."""
    loader = tree(name)["services/serve/loader.py"]
    assert "_refresh_from_archive" not in loader
    assert "production_version(self.store)" in loader
