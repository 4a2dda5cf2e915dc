"""The SageMaker training job's ``train`` channel has a writer (issue 38 §1: every S3 prefix
a component reads has a writer in the same design).

The job read ``s3://<models bucket>/pipeline/training-sets/latest/``, which nothing
deployed wrote. Now the stream's transform function lands each batch there too
(``TRAINING_SET_URI``), and the ``objects`` rule counts a channel's ``S3Uri`` as a reader
that needs a writer: code a runtime runs writing a key under an ``s3://`` URI the runtime
is given (the constant head of an f-string key counts), or a Terraform object. By mutation,
like :mod:`tests.design.unit.test_wiring`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from keel.design.wiring import check_wiring as findings_of
from keel.design.wiring.objects import written_heads
from tests.design.codegen_cases import request_for, with_patterns
from tests.design.unit.test_wiring import BATCH, mutate, only, tree
from tests.support.hcl import parse_once

#: The two SageMaker training shapes: MSK with the Lambda transform, one region and three.
SHAPES = ("streaming_features", "streaming_only_three_regions")
TRANSFORM = "infra/modules/transform/main.tf"
TRAIN = "infra/modules/train/main.tf"
HANDLER = "services/ingest/lambda_handler.py"
CHANNEL = (
    'S3Uri                  = "s3://${aws_s3_bucket.models.id}/pipeline/training-sets/latest/"'
)


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


def _channel_line(files: dict[str, str]) -> int:
    lines = files[TRAIN].splitlines()
    return next(n for n, line in enumerate(lines, 1) if "S3Uri" in line and "training-sets" in line)


def _check(files: dict[str, str], message: str) -> None:
    """``message`` is the channel's finding, at the channel's line, whatever keys the
    other runtimes write (listed in the middle)."""
    head, _, tail = message.partition(" (the keys runtimes write: ")
    assert head == (
        f"{TRAIN}:{_channel_line(files)} the SageMaker channel train reads "
        "s3://${aws_s3_bucket.models.id}/pipeline/training-sets/latest/, under which nothing "
        "in the design writes: no runtime's code writes a key there under an s3:// URI the "
        "Terraform gives it and it reads"
    )
    written, _, rest = tail.partition("), ")
    assert "training-sets" not in written
    assert rest == "and no aws_s3_object or Step Functions S3 state puts one"


@pytest.mark.parametrize("name", SHAPES)
def test_the_stream_function_writes_the_training_channel(name: str) -> None:
    """The function is given the channel's prefix, may write the models bucket, and its
    code lands each batch there; the training role reads that bucket."""
    files = tree(name)
    assert CHANNEL in files[TRAIN]
    transform = files[TRANSFORM]
    assert (
        'TRAINING_SET_URI = "s3://${var.training_set_bucket}/pipeline/training-sets/latest"'
        in transform
    )
    # The root hands the function the training module's bucket, by name and to write.
    root = files["infra/main.tf"]
    regions = [
        line.split('"')[1] for line in root.splitlines() if line.startswith('module "train_')
    ]
    assert regions, root
    for region in regions:
        r = region.removeprefix("train_")
        assert f"training_set_bucket      = module.train_{r}.training_set_bucket" in root
        assert (
            f"target_bucket_arns       = concat(module.store_{r}.data_bucket_arns, "
            f"module.feature_{r}.data_bucket_arns, module.train_{r}.data_bucket_arns)"
        ) in root
    assert 'output "training_set_bucket"' in files["infra/modules/train/outputs.tf"]
    assert "value       = aws_s3_bucket.models.id" in files["infra/modules/train/outputs.tf"]
    # The function's role writes every target bucket; the training role reads its own.
    assert (
        'Resource = [for arn in concat([aws_s3_bucket.artifacts.arn], var.target_bucket_arns) : "${arn}/*"]'
        in transform
    )
    assert (
        'Resource = [for arn in distinct(concat(var.source_bucket_arns, [aws_s3_bucket.models.arn])) : "${arn}/*"]'
        in files[TRAIN]
    )
    handler = files[HANDLER]
    assert 'os.environ.get("TRAINING_SET_URI", None)' in handler
    assert (
        "test_the_stream_function_names_each_batch_from_its_positions"
        in files["tests/test_ingest.py"]
    )
    assert findings_of(files) == []


@pytest.mark.parametrize("name", SHAPES)
def test_a_channel_nothing_writes_fails_naming_it(name: str) -> None:
    """Without the function's TRAINING_SET_URI (the Terraform side of the writer), the
    channel has no writer: the finding names the channel, file and line."""
    files = tree(name)
    env = (
        '      TRAINING_SET_URI = "s3://${var.training_set_bucket}/pipeline/training-sets/latest"\n'
    )
    broken = mutate(files, TRANSFORM, env, "")
    (finding,) = only(findings_of(broken), "objects")
    assert finding.file == TRAIN
    _check(broken, finding.message)
    # What the function writes under its DATA_URI is listed: the landing store's keys.
    assert "pipeline/raw/date=" in finding.message


def test_a_function_that_does_not_write_what_it_is_given_fails() -> None:
    """The code side: a function given the URI but whose code no longer reads it writes
    nothing there (its DATA_URI keys land elsewhere)."""
    files = tree(SHAPES[0])
    broken = mutate(files, HANDLER, '"TRAINING_SET_URI", None', '"TRAINING_SET", None')
    (finding,) = only(findings_of(broken), "objects")
    assert finding.file == TRAIN
    _check(broken, finding.message)


def test_the_channel_moved_elsewhere_than_the_writer_fails() -> None:
    """Keys are compared: a channel on another prefix than the one written is unwired,
    and the finding lists the keys that are written."""
    files = tree(SHAPES[0])
    broken = mutate(files, TRAIN, "/pipeline/training-sets/latest/", "/pipeline/training-sets/v2/")
    (finding,) = only(findings_of(broken), "objects")
    assert finding.file == TRAIN
    assert (
        "the SageMaker channel train reads s3://${aws_s3_bucket.models.id}/pipeline/training-sets/v2/"
        in (finding.message)
    )
    assert (
        "pipeline/training-sets/latest/quarantine/, pipeline/training-sets/latest/raw/date="
        in finding.message
    )


def test_a_terraform_object_under_the_channel_is_a_writer() -> None:
    files = tree(SHAPES[0])
    env = (
        '      TRAINING_SET_URI = "s3://${var.training_set_bucket}/pipeline/training-sets/latest"\n'
    )
    broken = mutate(files, TRANSFORM, env, "")
    seeded = {
        **broken,
        "infra/modules/train/seed.tf": 'resource "aws_s3_object" "seed" {\n'
        "  bucket  = aws_s3_bucket.models.id\n"
        '  key     = "pipeline/training-sets/latest/raw/date=2026-01-01/part-seed.jsonl"\n'
        '  content = ""\n'
        "}\n",
    }
    assert [f for f in findings_of(seeded) if f.rule == "objects"] == []


def test_key_heads_follow_f_strings_and_key_functions() -> None:
    text = (
        'PREFIX = "registry/latest/model.tar.gz"\n\n\n'
        "def partition_key(day: str, source: str) -> str:\n"
        '    return f"raw/date={day}/part-{source}.jsonl"\n\n\n'
        "def either(flag: bool) -> str:\n"
        '    return "a/x" if flag else "b/y"\n\n\n'
        "def land(store, day, source, rows, name):\n"
        "    write_jsonl(store, partition_key(day, source), rows)\n"
        '    store.write_bytes(f"quarantine/{source}.jsonl", b"")\n'
        '    store.write_bytes(PREFIX, b"")\n'
        '    store.write_bytes(f"{name}/free", b"")\n'
        "    write_jsonl(store, either(True), rows)\n"
    )
    assert written_heads("m.py", text) == {
        "raw/date=",
        "quarantine/",
        "registry/latest/model.tar.gz",
    }


def _batch_with_sagemaker_training() -> dict[str, str]:
    """batch_training (S3 batch ingest, Glue transform) trained by SageMaker instead."""
    return render_request(with_patterns(request_for(BATCH), "train:sagemaker-training"))


GLUE_ARG = (
    '    "--training_set_uri"                 = '
    '"s3://${var.training_set_bucket}/pipeline/training-sets/latest"\n'
)


def test_the_glue_transform_job_writes_the_training_channel_in_batch_designs() -> None:
    """With batch ingest, the Glue transform job lands the landing bucket's files in its
    store's raw/ and in the channel (jobs/glue/transform.py), given both URIs; its role
    may write the models bucket. Without the argument, or with a script that does not read
    it, the channel has no writer."""
    files = _batch_with_sagemaker_training()
    assert findings_of(files) == []
    transform = files[TRANSFORM]
    assert GLUE_ARG in transform
    assert '"--landing_uri"                      = "s3://${var.landing_bucket}/incoming/"' in (
        transform
    )
    root = files["infra/main.tf"]
    assert "landing_bucket      = module.ingest_eu_west_1.data_bucket_names[0]" in root
    assert "training_set_bucket = module.train_eu_west_1.training_set_bucket" in root
    assert "module.train_eu_west_1.data_bucket_arns)" in root
    script = files["jobs/glue/transform.py"]
    assert 'if "training_set_uri" in args:' in script
    assert "def test_the_job_lands_each_landing_file_in_every_store" in files["tests/test_jobs.py"]
    (finding,) = only(findings_of(mutate(files, TRANSFORM, GLUE_ARG, "")), "objects")
    assert finding.file == TRAIN
    assert "the SageMaker channel train reads" in finding.message
    unread = {
        **files,
        "jobs/glue/transform.py": script.replace('"training_set_uri"', '"training_set"'),
    }
    (finding,) = only(findings_of(unread), "objects")
    assert "the SageMaker channel train reads" in finding.message
    # Batch designs trained elsewhere land the files too, with no channel to write.
    plain = tree(BATCH)
    assert '"--landing_uri"' in plain[TRANSFORM] and "training_set" not in plain[TRANSFORM]
