"""The rules as the guardrail of the planner and critic agents (keel.design.agents), the
security critic (keel.design.security), the auto-revision's trigger and the policy file's
fields (issue 24 §4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keel.design.agents import (
    guard_findings,
    guard_plan,
    planner_message,
    read_agent_reply,
    reply_schema,
    revision_for,
)
from keel.design.constraints import Compliance, parse_constraints
from keel.design.critics import TechReview, estimate_plan_cost, review_plan
from keel.design.planner import Revision, plan
from keel.design.policy import PolicySettings, evaluate_policy, policy_from_yaml
from keel.design.security import review_security
from tests.design.unit.design_data import catalog, prices

BATCH: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "medium",
    "data_classification": "internal",
    "workload_types": ["batch"],
}


def rules_plan(data: dict[str, Any] = BATCH) -> Any:
    return plan(parse_constraints(data), catalog())


def choices(base: Any = None, **picked: str) -> dict[str, Any]:
    """A planner reply: ``base``'s choices (the batch rules plan by default), ``picked``
    in place of theirs."""
    chosen = {c.capability.value: c.pattern_id for c in (base or rules_plan()).choices}
    chosen.update(picked)
    return {"choices": [{"capability": k, "pattern_id": v, "why": "t"} for k, v in chosen.items()]}


def test_an_eligible_alternative_is_taken_and_the_rest_stays() -> None:
    c = parse_constraints(BATCH)
    out = guard_plan(c, catalog(), rules_plan(), choices(train="train:sagemaker-training"))
    assert out.refusals == []
    assert out.plan.pattern_ids()[4] == "train:sagemaker-training"
    assert out.accepted["train"] == "train:sagemaker-training"
    assert "planner agent" in out.plan.choices[4].justification
    assert out.plan.pattern_ids()[:4] == rules_plan().pattern_ids()[:4]


@pytest.mark.parametrize(
    ("picked", "rule", "why"),
    [
        ({"serve": "serve:triton-gpu-fleet"}, "not_in_catalogue", "not in catalogue"),
        ({"serve": "train:sagemaker-training"}, "wrong_capability", "is a train pattern"),
        ({"serve": "serve:lambda-serverless"}, "excluded", "does not support batch"),
        ({"transform": "transform:kinesis-lambda"}, "excluded", "needs one of"),
    ],
)
def test_a_proposal_the_rules_refuse_is_recorded_and_the_rules_choice_stands(
    picked: dict[str, str], rule: str, why: str
) -> None:
    c = parse_constraints(BATCH)
    rules = rules_plan()
    out = guard_plan(c, catalog(), rules, choices(**picked))
    assert out.plan.pattern_ids() == rules.pattern_ids()
    assert [r.rule for r in out.refusals] == [rule]
    assert why in out.refusals[0].reason
    assert out.refusals[0].line().startswith("refused planner proposal")


def test_a_missing_capability_and_a_policy_breach_are_refused() -> None:
    c = parse_constraints(BATCH)
    reply = choices(govern="govern:mlflow-registry")
    reply["choices"] = [x for x in reply["choices"] if x["capability"] != "serve"]
    strict = PolicySettings(required_compliance=[Compliance.HIPAA])
    out = guard_plan(c, catalog(), rules_plan(), reply, strict)
    rules = {r.rule: r for r in out.refusals}
    assert set(rules) == {"missing_capability", "policy"}
    assert "required_compliance" in rules["policy"].reason
    assert out.plan.pattern_ids() == rules_plan().pattern_ids()
    # Without the organisation's regime the same proposal passes.
    assert (
        guard_plan(c, catalog(), rules_plan(), reply).accepted["govern"] == "govern:mlflow-registry"
    )


def test_no_reply_is_the_rules_plan() -> None:
    out = guard_plan(parse_constraints(BATCH), catalog(), rules_plan(), None)
    assert out.plan == rules_plan() and out.accepted == {}


def test_replies_are_read_strictly_and_the_schema_names_the_catalogue() -> None:
    ok, problems = read_agent_reply("planner", json.dumps(choices()))
    assert ok is not None and problems == []
    bad, problems = read_agent_reply("critic_tech", '{"findings": [{"severity": "huge"}]}')
    assert bad is None and any("severity" in p for p in problems)
    assert read_agent_reply("planner", "no json")[0] is None
    schema = reply_schema("planner", catalog())
    enum = schema["$defs"]["AgentChoice"]["properties"]["pattern_id"]["enum"]
    assert "serve:ecs-fargate-fastapi" in enum and "serve:triton-gpu-fleet" not in enum
    message = json.loads(planner_message(parse_constraints(BATCH), rules_plan(), catalog()))
    serve = next(x for x in message["capabilities"] if x["capability"] == "serve")
    assert serve["rules_choice"] == "serve:sagemaker-batch-transform"
    assert any("excluded" in x for x in serve["candidates"])


def test_critic_findings_outside_the_plan_are_refused() -> None:
    p = rules_plan()
    reply = {
        "findings": [
            {"severity": "high", "detail": "x", "patterns": ["serve:triton-gpu-fleet"]},
            {"severity": "medium", "detail": "y", "patterns": ["store:dynamodb"]},
            {
                "severity": "high",
                "detail": "z",
                "patterns": ["train:ecs-fargate-jobs"],
                "revise": True,
            },
        ]
    }
    risks, refusals, revise = guard_findings("critic_tech", p, catalog(), reply, "feasibility")
    assert [r.rule for r in refusals] == ["not_in_catalogue", "not_in_plan"]
    assert [r.detail for r in risks] == ["model: z"] and revise


def test_revision_asks_for_cheaper_over_the_band_and_replaces_flagged_patterns() -> None:
    c = parse_constraints({**BATCH, "budget_band": "low", "throughput": {"data_gb_per_day": 5000}})
    p = plan(c, catalog())
    cost = estimate_plan_cost(p, catalog(), c, prices())
    assert cost.monthly_usd > 1000
    rev = revision_for(c, p, [review_plan(c, p, catalog())], cost)
    assert rev is not None and rev.prefer_cheaper and "low band" in rev.reasons[0]
    cheap = parse_constraints(BATCH)
    cp = plan(cheap, catalog())
    assert (
        revision_for(
            cheap,
            cp,
            [review_plan(cheap, cp, catalog())],
            estimate_plan_cost(cp, catalog(), cheap, prices()),
        )
        is None
    )


def test_a_revision_replaces_a_pattern_only_where_an_alternative_exists() -> None:
    c = parse_constraints(BATCH)
    revised = plan(
        c,
        catalog(),
        revision=Revision(
            reasons=["t"], avoid=["train:ecs-fargate-jobs", "serve:sagemaker-batch-transform"]
        ),
    )
    assert "train:ecs-fargate-jobs" not in revised.pattern_ids()
    # The only eligible serving pattern stays: a revision never makes a gap.
    assert "serve:sagemaker-batch-transform" in revised.pattern_ids() and not revised.gaps


def test_security_critic_and_organisation_policy() -> None:
    c = parse_constraints({**BATCH, "regions": ["us-east-1"], "compliance": ["gdpr"]})
    p = plan(c, catalog())
    ids = [r.id for r in review_security(c, p, catalog()).risks]
    assert "compliance:gdpr:residency" in ids
    strict = PolicySettings(required_compliance=[Compliance.PCI_DSS], allowed_regions=["eu-west-1"])
    c2 = parse_constraints({**BATCH, "workload_types": ["batch"]})
    p2 = plan(c2, catalog()).model_copy()
    p2 = p2.model_copy(
        update={
            "choices": [
                ch
                if ch.capability.value != "govern"
                else ch.model_copy(update={"pattern_id": "govern:mlflow-registry"})
                for ch in p2.choices
            ]
        }
    )
    found = {r.id: r for r in review_security(c2, p2, catalog(), strict).risks}
    assert found["compliance:pci_dss:govern:mlflow-registry"].severity == "high"
    report = evaluate_policy(
        c2,
        p2,
        catalog(),
        estimate_plan_cost(p2, catalog(), c2, prices()),
        TechReview(risks=[]),
        strict,
    )
    assert report.status_of("required_compliance") == "fail"
    assert report.status_of("cloud_policy") == "pass"
    gcp_only = PolicySettings(allowed_clouds=["gcp"])  # type: ignore[list-item]
    assert (
        evaluate_policy(
            c2,
            p2,
            catalog(),
            estimate_plan_cost(p2, catalog(), c2, prices()),
            TechReview(risks=[]),
            gcp_only,
        ).status_of("cloud_policy")
        == "fail"
    )


def test_policy_file_fields_are_checked() -> None:
    assert policy_from_yaml({"version": 1, "policy": {"gate_delta_usd": 100}}).gate_delta_usd == 100
    assert policy_from_yaml(None) == PolicySettings()
    with pytest.raises(ValueError, match="allowed_region"):
        policy_from_yaml({"policy": {"allowed_region": ["eu-west-1"]}})
    with pytest.raises(ValueError):
        policy_from_yaml({"policy": {"gate_delta_pct": -1}})


STREAM: dict[str, Any] = {**BATCH, "workload_types": ["streaming"]}


def test_a_job_transform_needs_an_ingest_that_lands_files() -> None:
    """Glue and EMR jobs land the landing bucket's files (batch drops, Firehose's from
    Kinesis); MSK lands none, so with MSK a job transform would read nothing: refused,
    and the rules' stream consumer stands. With the Kinesis ingest it is taken."""
    c = parse_constraints(STREAM)
    rules = rules_plan(STREAM)
    by_cap = {ch.capability.value: ch.pattern_id for ch in rules.choices}
    assert by_cap["ingest"] == "ingest:kinesis-streams"
    assert by_cap["transform"] == "transform:kinesis-lambda"

    glue = guard_plan(c, catalog(), rules, choices(rules, transform="transform:glue-etl"))
    assert [r.reason for r in glue.refusals] == ["does not support streaming workloads"]
    emr = "transform:emr-serverless-spark"
    out = guard_plan(c, catalog(), rules, choices(rules, transform=emr))
    assert out.refusals == [], out.refusals
    assert out.accepted["transform"] == emr
    msk = choices(rules, ingest="ingest:msk-kafka", transform=emr)
    out = guard_plan(c, catalog(), rules, msk)
    assert out.accepted["ingest"] == "ingest:msk-kafka"
    (refusal,) = out.refusals
    assert refusal.rule == "requires", refusal
    assert "ingest:s3-batch" in refusal.reason and "ingest:kinesis-streams" in refusal.reason
    assert out.plan.pattern_ids()[:2] == ["ingest:msk-kafka", "transform:kinesis-lambda"]


def test_mlflow_registry_needs_a_training_that_can_reach_it() -> None:
    """A SageMaker training job runs network-isolated: it cannot register in an MLflow
    server. So govern:mlflow-registry requires the ECS training; a planner agent's
    SageMaker training on a plan that registers in MLflow is refused, and the rules'
    training stands."""
    from tests.design.codegen_cases import request_for

    req = request_for("rag")
    by_cap = {ch.capability.value: ch.pattern_id for ch in req.plan.choices}
    assert (by_cap["train"], by_cap["govern"]) == (
        "train:ecs-fargate-jobs",
        "govern:mlflow-registry",
    )
    reply = choices(req.plan, train="train:sagemaker-training")
    out = guard_plan(req.constraints, catalog(), req.plan, reply)
    (refusal,) = out.refusals
    assert refusal.rule == "requires" and refusal.proposal == "train -> train:sagemaker-training"
    assert "govern:mlflow-registry needs one of train:ecs-fargate-jobs" in refusal.reason
    assert out.plan.pattern_ids() == req.plan.pattern_ids()
