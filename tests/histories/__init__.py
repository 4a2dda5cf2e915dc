"""The replay corpus: recorded histories of every Keel workflow family.

``tests/test_replay.py`` replays each ``*.json`` here against the current workflow code;
``tests/histories/record.py`` records them. See docs/replay.md.
"""

from __future__ import annotations

from pathlib import Path

HISTORIES_DIR = Path(__file__).resolve().parent

# Every history the recorder writes, by file stem. The replay test fails if one is missing.
CORPUS: tuple[str, ...] = (
    "gate_approved_update",
    "gate_local_audit",
    "gate_audit_after_answer",
    "gate_audit_rows_at_once",
    "gate_open_local",
    "gate_open_local_webhook",
    "gate_open_local_early",
    "gate_handler_rows_local",
    "gate_handler_rows_local_early",
    "gate_one_marker",
    "gate_one_marker_early",
    "gate_one_marker_expired",
    "gate_rejected_signal",
    "gate_readers_signal",
    "gate_self_readers",
    "gate_summary_memo",
    "gate_summary_memo_at_start",
    "gate_expired_with_reminders",
    "gate_duplicate_request",
    "gate_shared_key",
    "demo_approved",
    "demo_approved_gate",
    "demo_child_readers",
    "demo_child_readers_gate",
    "rllm_success",
    "rllm_recovered",
    "rllm_composed",
    "rllm_composed_keywords",
    "rllm_local_steps",
    "rllm_progress_memo",
    "mrp_approved",
    "mrp_budget_exceeded",
    "mrp_overlap_windows",
    "mrp_rejected",
    "mrp_evaluation_failed",
    "mrp_partial_success",
    "mrp_progress_memo",
    "srl_collection",
    "srl_collection_last",
    "srl_episode_recovered",
    "srl_collection_samples",
    "srl_episode_sample",
    "srl_collection_resumed",
    "srl_episode_resumed",
    "srl_collection_prefix",
    "srl_episode_prefix",
    "srl_collection_progress",
    "srl_collection_progress_last",
    "srl_episode_progress",
    "design_replanned",
    "design_iteration",
    "design_intake_unfit",
    "design_cost_workload",
    "design_progress_memo",
    "design_validation_failed",
    "design_repaired",
    "design_auto_revised",
    "design_agent_planned",
)
