"""``DesignPipeline``: requirements to a reviewed, costed, approved and generated design.

One workflow per decision set, id ``design/<project>/<decision set>``. The 12 nodes of
plan §21.1 (and the security critic) are a LangGraph ``StateGraph`` run through
Temporal's LangGraph plugin (``temporalio.langgraph.LangGraphPlugin``, registered on the
worker with :func:`build_graph`). Every node runs in the workflow
(``execute_in="workflow"``): the pure ones (coverage, questions, planner, critics,
policy, rationale) compute there and replay, and the ones that do I/O (intake, codegen,
validators, persist) each call their own activity through ``workflows.common.call``, so
each keeps its row of limits in ``OPTIONS``, a summary in the Web UI and pydantic models
in history. The graph is the checkpoint-free part of LangGraph: the workflow history is
the checkpoint.

Loops: ``adaptive_questions`` waits for Update ``answers`` and goes back to
``coverage_check`` until the intake is covered; ``gate_hitl`` opens an ``ApprovalGate``
child per planner round, and a rejection's comment sends the graph back to ``planner``.

The package, by what each module holds:

- ``state``: the graph's state, the run's context, the effects a node emits and the
  ports it may call;
- ``intake``: intake, the coverage check and the questions loop;
- ``planner`` and ``critics``: the plan, the critics and the plan's auto-revision;
- ``gate_loop``: the policy, the approval gate per planner round and where a decision
  sends the graph;
- ``outputs``: codegen, the validators, the rationale and persist;
- ``graph``: the nodes and edges (:func:`build_graph`);
- ``read_model``: the status, events, rows and notices the effects update;
- ``workflow``: the ``DesignPipeline`` class, its Update and queries.
"""

from workflows.design.graph import GRAPH_NAME, build_graph
from workflows.design.workflow import DesignPipeline

__all__ = ["GRAPH_NAME", "DesignPipeline", "build_graph"]
