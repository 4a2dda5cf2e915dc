from __future__ import annotations

import json
from typing import Any

import blake3
import pytest

from keel.design.constraints import parse_constraints
from keel.design.critics import estimate_plan_cost, review_plan
from keel.design.planner import plan
from keel.design.policy import evaluate_policy
from keel.design.reasons import (
    ReasonCard,
    critic_cost_card,
    critic_tech_card,
    decision_id,
    design_rationale_md,
    node_idempotency_key,
    planner_cards,
    prompt_pack_hash,
    rationale_json,
)
from tests.design.unit.design_data import catalog, prices

TS = "2026-11-24T10:15:22Z"


def test_idempotency_key_is_blake3_of_thread_node_and_canonical_input() -> None:
    key = node_idempotency_key("ds-1", "planner", {"b": 1, "a": [1, 2]})
    expected = blake3.blake3(b'ds-1|planner|{"a":[1,2],"b":1}').hexdigest()
    assert key == f"blake3:{expected}"
    assert key == node_idempotency_key("ds-1", "planner", {"a": [1, 2], "b": 1})
    assert key != node_idempotency_key("ds-1", "critic_cost", {"a": [1, 2], "b": 1})
    assert key != node_idempotency_key("ds-2", "planner", {"a": [1, 2], "b": 1})


def test_idempotency_key_refuses_separator_in_names() -> None:
    with pytest.raises(ValueError, match="must not contain"):
        node_idempotency_key("ds|1", "planner", {})


def test_prompt_pack_hash_ignores_order_and_line_endings_but_not_edits() -> None:
    pack = {"planner.md": "# Planner\nChoose.\n", "critic.md": "# Critic\n"}
    h = prompt_pack_hash(pack)
    assert h == prompt_pack_hash(dict(reversed(list(pack.items()))))
    assert h == prompt_pack_hash({k: v.replace("\n", "\r\n") for k, v in pack.items()})
    assert h != prompt_pack_hash({**pack, "critic.md": "# Critic!\n"})
    assert h != prompt_pack_hash({"planner.md": pack["planner.md"]})
    assert h != prompt_pack_hash({"planner2.md": pack["planner.md"], "critic.md": "# Critic\n"})


def _run(data: dict[str, Any]) -> tuple[list[ReasonCard], str]:
    c = parse_constraints(data)
    p = plan(c, catalog())
    review = review_plan(c, p, catalog())
    cost = estimate_plan_cost(p, catalog(), c, prices())
    policy = evaluate_policy(c, p, catalog(), cost, review)
    key = node_idempotency_key("ds-1", "planner", c)
    pack = prompt_pack_hash({"planner.md": "x"})
    cards = planner_cards(
        p,
        idempotency_key=key,
        constraints_keys=sorted(data),
        trigger="constraints_updated",
        ts=TS,
        policy=policy,
        prompt_pack=pack,
    )
    cards.append(critic_tech_card(review, idempotency_key=key + "t", trigger="regen", ts=TS))
    cards.append(critic_cost_card(cost, idempotency_key=key + "c", trigger="regen", ts=TS))
    return cards, design_rationale_md(p, cards, policy, cost)


def test_cards_follow_the_schema_and_ids_are_stable() -> None:
    data = {"cloud": "aws", "regions": ["eu-west-1"], "workload_types": ["batch"]}
    cards, md = _run(data)
    again, _ = _run(data)
    assert [c.decision_id for c in cards] == [c.decision_id for c in again]
    assert len({c.decision_id for c in cards}) == len(cards)
    planner = [c for c in cards if c.agent == "planner"]
    assert len(planner) == 8
    for card in planner:
        assert card.choice is not None
        assert card.choice.id in {x.id for x in card.candidates}
        assert card.inputs.artifacts == [f"capability:{card.choice.id}"]
        assert card.prompt_pack_hash is not None
        assert card.policy_results["mandatory_capabilities"] == "pass"
    doc = rationale_json(cards)
    round_trip = [ReasonCard.model_validate(x) for x in json.loads(json.dumps(doc))["reason_cards"]]
    assert round_trip == cards
    assert md.startswith("## Design Rationale")
    for card in planner:
        assert card.choice is not None and f"`{card.choice.id}`" in md


def test_gap_becomes_a_low_confidence_card_naming_the_gap() -> None:
    cards, md = _run({"regions": ["us-east-1"], "workload_types": ["online"], "sla_latency_ms": 5})
    gap_cards = [c for c in cards if c.agent == "planner" and c.choice is None]
    assert len(gap_cards) == 2
    assert all(c.confidence == 0.05 for c in gap_cards)
    assert "| serve | none |" in md


def test_decision_id_is_a_uuid_from_the_key() -> None:
    a = decision_id("blake3:ab", "serve")
    assert a == decision_id("blake3:ab", "serve")
    assert a != decision_id("blake3:ab", "train")
    assert len(a) == 36 and a[14] == "4"
