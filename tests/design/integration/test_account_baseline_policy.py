"""The organisation's ``account_baseline`` (policy.yaml, issue 38 §3) reaches the run's
constraints, so the cost, the policy check and codegen see one setting: a run whose
policy asks for the baseline renders the account-wide resources, and the constraints it
reports say so; the same form under the default policy leaves it off.

The default policy's half runs without codegen: what a tree without the baseline renders
(no account-wide resource anywhere) is tests/design/unit/test_account.py's
``test_no_account_singleton_without_the_baseline``, and that the default policy leaves the
constraints alone is its ``test_the_flag_is_a_constraint_and_a_policy_setting_off_by_default``;
here the run shows the workflow reports the constraints it was given."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from client.design import start_design
from keel.design.policy import PolicySettings
from keel.design.steps import DesignInput, DesignResult
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from tests.design.unit.design_data import golden_cases
from tests.support.hcl import parse_once

#: Account-wide resources (one per account and region): only with the baseline.
SINGLETONS = (
    "aws_lakeformation_data_lake_settings",
    "aws_config_configuration_recorder",
    "aws_macie2_account",
)
FORM = golden_cases()["batch_training"]["constraints"]


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    """The worker runs in this process: its ``hcl`` validator and wiring check both parse
    every ``.tf`` of the tree; each distinct text is parsed once."""
    with parse_once():
        yield


async def _run(
    client: Client, settings: Settings, policy: PolicySettings, *, generate: bool = True
) -> DesignResult:
    inp = DesignInput(
        project=f"p-{uuid.uuid4().hex[:8]}",
        decision_set="ds1",
        requester="alice",
        intake=FORM,
        require_approval=False,
        generate=generate,
        policy=policy,
        # The baseline is Terraform: the validators that read it (and the secret scan).
        # The jailed ones (ruff, mypy, pytest, smoke) see the same Python either way and
        # run on every other generated tree in the suite.
        validators=["secrets", "hcl", "checkov", "wiring"],
    )
    handle = await start_design(client, inp, task_queue=settings.task_queue)
    result: DesignResult = await handle.result()
    assert result.status == "completed", result.validation
    return result


def _terraform(settings: Settings, result: DesignResult) -> str:
    assert result.files_digest
    files = artifact_store_from_settings(settings).get_json(result.files_digest)
    return "\n".join(text for path, text in sorted(files.items()) if path.endswith(".tf"))


async def test_policy_baseline_reaches_constraints_and_terraform(
    client: Client, settings: Settings, worker: Worker
) -> None:
    assert not FORM.get("account_baseline")
    on = await _run(client, settings, PolicySettings(account_baseline=True))
    assert on.constraints.account_baseline is True
    tf = _terraform(settings, on)
    rendered = [r for r in SINGLETONS if f'resource "{r}"' in tf]
    assert rendered, "the baseline was asked for and nothing account-wide was rendered"
    assert {n for n, s in on.validation.items() if s == "passed"} == {
        "secrets", "hcl", "checkov", "wiring",
    }, on.validation  # fmt: skip
    assert set(on.validation.values()) == {"passed", "not_run"}, on.validation

    off = await _run(client, settings, PolicySettings(), generate=False)
    assert not off.constraints.account_baseline
