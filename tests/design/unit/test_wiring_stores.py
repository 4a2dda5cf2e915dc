"""One store for the pipeline (issue 38 §1: every prefix a component reads has a writer):
the runtimes of a region that run pipeline steps are handed the same ``DATA_URI`` bucket,
the training's models bucket. Before, the Glue and EMR transforms, the stream's transform
function and the offline feature job each had a store of their own, which the training
never read. Mutation tests: every generated shape passes, each runtime put back on a
store of its own fails naming both stores and who uses them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keel.design.wiring import check_wiring
from keel.design.wiring.repo import Repo
from keel.design.wiring.stores import _stores
from tests.design.codegen_cases import CASES, FORMS
from tests.design.unit.test_wiring import mutate, only, tree
from tests.support.hcl import parse_once

TRANSFORM = "infra/modules/transform/main.tf"
FEATURE = "infra/modules/feature/main.tf"
OWN = "s3://${aws_s3_bucket.artifacts.id}/pipeline"
SHARED = "s3://${var.pipeline_bucket}/pipeline"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


def test_every_shape_runs_its_pipeline_on_one_store_per_region() -> None:
    """Each region's runtimes use one store, its training's models bucket, and the training
    is among them. (``test_wiring.py`` checks every shape passes every rule.)"""
    for name in [*CASES, *FORMS]:
        found = list(_stores(Repo.parse(tree(name))))
        regions = {region for region, *_ in found}
        assert regions and len({(r, store) for r, _, _, store in found}) == len(regions), name
        for region, where, _, ((instance, bucket), prefix) in found:
            assert (instance, bucket, prefix) == (f"train_{region}", "models", "/pipeline"), (
                name,
                where,
            )
        assert any(where.endswith(".train") for _, where, _, _ in found), name


def test_a_transform_job_on_a_store_of_its_own_fails() -> None:
    files = tree("batch_training")
    assert f'"--data_uri"                         = "{SHARED}"' in files[TRANSFORM]
    broken = mutate(files, TRANSFORM, SHARED, OWN)
    (finding,) = only(check_wiring(broken), "objects")
    assert finding.file == TRANSFORM
    assert finding.message == (
        "the pipeline's runtimes in eu_west_1 use 2 stores: "
        "s3://<module.train_eu_west_1.aws_s3_bucket.models>/pipeline "
        "(aws_ecs_task_definition.train, aws_glue_job.features, aws_sfn_state_machine.score); "
        "s3://<module.transform_eu_west_1.aws_s3_bucket.artifacts>/pipeline "
        "(aws_glue_job.transform): what a step writes in one store the next step never "
        "reads in another"
    )


def test_the_feature_job_and_the_stream_function_are_followed_too() -> None:
    files = tree("batch_training")
    broken = mutate(files, FEATURE, SHARED, OWN)
    (finding,) = only(check_wiring(broken), "objects")
    assert finding.file == FEATURE
    assert "module.feature_eu_west_1.aws_s3_bucket.artifacts>/pipeline (aws_glue_job.features)" in (
        finding.message
    )
    stream = tree("streaming_features")
    assert f'DATA_URI         = "{SHARED}"' in stream[TRANSFORM]
    broken = mutate(
        stream, TRANSFORM, f'DATA_URI         = "{SHARED}"', f'DATA_URI         = "{OWN}"'
    )
    (finding,) = only(check_wiring(broken), "objects")
    assert finding.file == TRANSFORM
    assert "artifacts>/pipeline (aws_lambda_function.transform)" in finding.message
