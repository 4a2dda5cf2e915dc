"""The pipeline's models and graph shape: ids, input checks, the §21.1 node order."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from keel.design.steps import NODES, DesignAnswers, DesignInput, workflow_id
from workflows.common import OPTIONS
from workflows.design import build_graph


def test_graph_has_the_nodes_in_order() -> None:
    # The twelve of plan §21.1 and the security critic (issue 24 §4).
    assert list(build_graph().nodes) == list(NODES)
    assert len(NODES) == 13


def test_no_node_reaches_into_the_workflow_instance() -> None:
    """Nodes read the state (``ctx``) and their explicit ports, never the instance."""
    import importlib
    import inspect
    import pkgutil

    import workflows.design as package
    from workflows.design.critics import critic_cost_node
    from workflows.design.gate_loop import policy_eval_node
    from workflows.design.planner import planner_node

    modules = [
        importlib.import_module(f"workflows.design.{m.name}")
        for m in pkgutil.iter_modules(package.__path__)
    ]
    assert len(modules) >= 8
    for module in (package, *modules):
        assert "workflow.instance(" not in inspect.getsource(module), module.__name__
    for name, fn in {
        "planner": planner_node,
        "critic_cost": critic_cost_node,
        "policy_eval": policy_eval_node,
    }.items():
        assert 'state["ctx"]' in inspect.getsource(fn), name


def test_every_design_activity_has_limits() -> None:
    from keel.design import steps

    for ref in (
        steps.LOAD,
        steps.INTAKE_EXTRACT,
        steps.AGENT,
        steps.CODEGEN,
        steps.VALIDATE,
        steps.PERSIST,
    ):
        assert ref.name in OPTIONS, ref.name
    # The long ones heartbeat, so a lost worker is noticed before their whole limit.
    assert OPTIONS[steps.CODEGEN.name].heartbeat is not None
    assert OPTIONS[steps.VALIDATE.name].heartbeat is not None


def test_input_ids_and_defaults() -> None:
    inp = DesignInput(
        project="acme", decision_set="ds-1", requester="al", approvers=["b", "a", "b"]
    )
    assert workflow_id(inp.project, inp.decision_set) == "design/acme/ds-1"
    assert inp.approvers == ["a", "b"]
    assert inp.generate and inp.require_approval
    for bad in ("", "a/b", "../x", "x" * 65):
        with pytest.raises(ValidationError):
            DesignInput(project=bad, decision_set="ds1", requester="al")
    with pytest.raises(ValidationError):
        DesignInput(project="p", decision_set="ds1", requester="al", surprise=1)  # type: ignore[call-arg]


def test_answers_need_at_least_one_field() -> None:
    with pytest.raises(ValidationError):
        DesignAnswers(answers={})


def test_a_validator_selection_is_checked_and_kept_in_report_order() -> None:
    base = {"project": "p", "decision_set": "ds1", "requester": "alice"}
    assert DesignInput(**base).validators is None  # every validator
    picked = DesignInput(**base, validators=["wiring", "checkov", "wiring"]).validators
    assert picked == ["checkov", "wiring"]
    with pytest.raises(ValidationError, match="unknown validator"):
        DesignInput(**base, validators=["checkov", "lint"])
    with pytest.raises(ValidationError, match="at least one validator"):
        DesignInput(**base, validators=[])
