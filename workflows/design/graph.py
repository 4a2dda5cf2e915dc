"""The §21.1 graph: its nodes and edges, every node run in the workflow."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langgraph.graph import END, START, StateGraph


from workflows.design.critics import (
    after_critics,
    critic_cost_node,
    critic_security_node,
    critic_tech_node,
)
from workflows.design.gate_loop import after_gate, gate_hitl_node, policy_eval_node
from workflows.design.intake import (
    adaptive_questions_node,
    after_coverage,
    coverage_check_node,
    intake_extract,
)
from workflows.design.outputs import (
    codegen_node,
    diff_and_persist_node,
    rationale_compile_node,
    validators_node,
)
from workflows.design.planner import planner_node
from workflows.design.state import DesignPorts, GraphState

#: The name the graph is registered under in the plugin.
GRAPH_NAME = "design"


def build_graph() -> StateGraph[GraphState, Any, GraphState, GraphState]:
    """The §21.1 graph, every node run in the workflow. A fresh graph per call: the
    plugin rewrites the nodes of the graph it is given."""
    g: StateGraph[GraphState, Any, GraphState, GraphState] = StateGraph(
        GraphState, context_schema=DesignPorts
    )
    # Two shapes: (state) and (state, runtime) for the nodes that use the ports.
    nodes: dict[str, Any] = {
        "intake_extract": intake_extract,
        "coverage_check": coverage_check_node,
        "adaptive_questions": adaptive_questions_node,
        "planner": planner_node,
        "critic_tech": critic_tech_node,
        "critic_cost": critic_cost_node,
        "critic_security": critic_security_node,
        "policy_eval": policy_eval_node,
        "gate_hitl": gate_hitl_node,
        "codegen": codegen_node,
        "validators": validators_node,
        "rationale_compile": rationale_compile_node,
        "diff_and_persist": diff_and_persist_node,
    }
    for name, fn in nodes.items():
        # The plugin shows a workflow node's summary as the run's current details.
        g.add_node(name, fn, metadata={"execute_in": "workflow", "summary": f"design: {name}"})
    g.add_edge(START, "intake_extract")
    g.add_edge("intake_extract", "coverage_check")
    g.add_conditional_edges(
        "coverage_check",
        after_coverage,
        ["planner", "adaptive_questions", "rationale_compile"],
    )
    g.add_edge("adaptive_questions", "coverage_check")
    g.add_edge("planner", "critic_tech")
    g.add_edge("critic_tech", "critic_cost")
    g.add_edge("critic_cost", "critic_security")
    # The critics may send the plan back to the planner once (the auto-revision).
    g.add_conditional_edges("critic_security", after_critics, ["planner", "policy_eval"])
    g.add_edge("policy_eval", "gate_hitl")
    g.add_conditional_edges("gate_hitl", after_gate, ["codegen", "planner", "rationale_compile"])
    g.add_edge("codegen", "validators")
    g.add_edge("validators", "rationale_compile")
    g.add_edge("rationale_compile", "diff_and_persist")
    g.add_edge("diff_and_persist", END)
    return g
