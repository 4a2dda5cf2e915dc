"""The wiring check's rules for the gaps issue 38 §2/§3 found in generated repositories
that passed it: a root variable without a default that nothing passes, a variable the
code needs deployed (its absence raises) that no runtime sets, a service that calls an
AWS API its role may not call, and an image CI builds that nothing runs.

By mutation, like :mod:`tests.design.unit.test_wiring`: the generated tree passes, a copy
broken at one joint fails with the finding's message.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from keel.design.wiring import check_wiring as findings_of
from tests.design.codegen_cases import CASES, request_for, request_for_form
from tests.design.unit.test_wiring import messages, mutate, only, tree
from tests.support.hcl import parse_once

BATCH = "batch_training"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


@functools.cache
def _baseline(name: str) -> tuple[tuple[str, str], ...]:
    req = request_for(name) if name in CASES else request_for_form(name)
    constraints = req.constraints.model_copy(update={"account_baseline": True})
    return tuple(render_request(req.model_copy(update={"constraints": constraints})).items())


def baseline(name: str) -> dict[str, str]:
    return dict(_baseline(name))


# ------------------------------------------------------------------------------ variables


def test_a_required_root_variable_nothing_passes_fails() -> None:
    """lake_admin_arns (the baseline's Lake Formation admins) had no default, and neither
    the README's plan nor its apply passed it."""
    files = baseline(BATCH)
    assert findings_of(files) == []
    files = mutate(
        files,
        "infra/variables.tf",
        "  type        = list(string)\n  default     = []\n}",
        "  type        = list(string)\n}",
    )
    found = messages(only(findings_of(files), "variables"))
    for sub in ("plan", "apply"):
        assert (
            f"README.md: terraform {sub} in infra/ does not pass lake_admin_arns, which the "
            "root module declares without a default (infra/variables.tf)"
        ) in found
    # A tfvars file Terraform loads by itself gives it; so does -var on each command.
    assert findings_of({**files, "infra/terraform.tfvars": 'lake_admin_arns = ["x"]\n'}) == []
    assert findings_of({**files, "infra/admins.auto.tfvars.json": '{"lake_admin_arns": []}'}) == []
    passed = files["README.md"].replace(
        '-var "image_tag=$(git rev-parse HEAD)"',
        '-var "image_tag=$(git rev-parse HEAD)" -var \'lake_admin_arns=["x"]\'',
    )
    assert findings_of({**files, "README.md": passed}) == []


def test_a_required_root_variable_with_no_command_at_all_fails() -> None:
    files = mutate(
        baseline(BATCH),
        "infra/variables.tf",
        "  type        = list(string)\n  default     = []\n}",
        "  type        = list(string)\n}",
    )
    files["README.md"] = "# nothing to run\n"
    found = messages(only(findings_of(files), "variables"))
    assert (
        "infra/variables.tf: nothing passes lake_admin_arns, which the root module infra/ "
        "declares without a default: no README or CI command plans or applies infra/"
    ) in found
    assert "nothing passes image_tag" in found


def test_applying_a_saved_plan_needs_no_variables() -> None:
    """``terraform apply tfplan`` runs what the plan (which passed them) decided."""
    files = tree(BATCH)
    assert "terraform apply tfplan" in files["README.md"]
    files = mutate(files, "README.md", "terraform plan -out=tfplan", "terraform plan -out tfplan")
    assert findings_of(files) == []
