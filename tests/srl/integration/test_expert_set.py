"""From a published dataset to an expert set and step-wise rewards, end to end: a
CommitPackFT fixture through `srl data ingest`, `srl data process` and `srl tasks` (no gold
actions), a teacher collection whose answers the jail verifies against each record's
post-text, `srl expert` keeping the verified trajectories step by step, and a second
collection over that expert set whose step n is scored against the expert's step n. Real
Temporal, jail, ast-grep, SQL and CLI; the models are scripted OpenAI-compatible servers
(the embedded model verifies too few steps for exact assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client

from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.steps import CollectionInput, CollectionResult, SrlTask, parse_tasks
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.support.scripted_openai import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from workers.main import build_worker

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "srl" / "fixtures" / "datasets" / "commitpackft"

PRE_JS = "function add(a, b) {\n  return a + b;\n}\n"
MID_JS = "const add = function (a, b) { return a + b; };\n"
POST_JS = "const add = (a, b) => a + b;\n"
TO_EXPRESSION = {
    "pattern": "function $F($$$P) { return $E; }",
    "rewrite": "const $F = function ($$$P) { return $E; };",
}
TO_ARROW = {"pattern": "function ($$$P) { return $E; }", "rewrite": "($$$P) => $E"}
AT_ONCE = {"pattern": "function $F($$$P) { return $E; }", "rewrite": "const $F = ($$$P) => $E;"}
PI = {"pattern": "3.14", "rewrite": "math.pi"}


def _answer(action: dict[str, str], language: str) -> ScriptedReply:
    body = {
        "think": "one rewrite",
        "action": {**action, "language": language},
        "state_update": {"decisions": ["rewrite"]},
    }
    return ScriptedReply(content=json.dumps(body))


def _code(req: RecordedRequest) -> str:
    return str(req.json["messages"][-1]["content"])


def teacher(req: RecordedRequest) -> ScriptedReply:
    """Two steps to the arrow function (as the expert will have them); the Python task
    gets an action that changes the file but never reaches its post-text."""
    code = _code(req)
    if "function add(a, b) {" in code:
        return _answer(TO_EXPRESSION, "javascript")
    if "const add = function" in code:
        return _answer(TO_ARROW, "javascript")
    return _answer(PI, "python")


def srl_cli(args: list[str | Path], settings: Settings) -> tuple[int, Any, str]:
    env = {
        **os.environ,
        "KEEL_DATA_DIR": str(settings.data_dir),
        "KEEL_TEMPORAL_ADDRESS": settings.temporal_address,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_METRICS_PORT": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "cli.srl", *map(str, args), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


async def _collect(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    tasks: bytes,
    answer: Callable[[RecordedRequest], ScriptedReply],
    collection: str,
) -> CollectionResult:
    with ScriptedOpenAIServer(default=answer) as srv:
        run_settings = settings.model_copy(
            update={
                "models_config": write_models_config(
                    tmp_path / f"{collection}-models.yaml", srv.base_url
                )
            }
        )
        async with build_worker(client, run_settings):
            digest, count = upload_tasks(artifact_store_from_settings(settings), tasks)
            inp = CollectionInput(
                collection=collection,
                tasks_digest=digest,
                task_count=count,
                source="teacher",
                model="local",
                max_steps=3,
                # Free running: an episode ends when verified (the shortcut in one step).
                step_mode="free_running",
            )
            handle = await start_collection(client, inp, task_queue=settings.task_queue)
            return await handle.result()


async def test_a_dataset_becomes_an_expert_set_that_scores_step_by_step(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    # 1. A published layout through ingest, process and tasks: tasks without actions.
    data = tmp_path / "data"
    rc, doc, err = srl_cli(
        ["data", "ingest", "commitpackft", "--from", FIXTURE,
         "--manifest", FIXTURE / "manifest.json", "--out", data],
        settings,
    )  # fmt: skip
    assert rc == 0, err
    rc, doc, err = srl_cli(["data", "process", "--out", data], settings)
    assert rc == 0, err
    task_file = tmp_path / "tasks.jsonl"
    rc, doc, err = srl_cli(
        ["tasks", "--data", data, "--out", task_file, "-s", "train", "-s", "dev", "-s", "test"],
        settings,
    )
    assert rc == 0, err
    tasks = parse_tasks(task_file.read_bytes())
    assert sorted(t.language for t in tasks) == ["javascript", "python"]
    assert all(t.gold_action is None and t.expert is None for t in tasks)
    js = next(t for t in tasks if t.language == "javascript")
    py = next(t for t in tasks if t.language == "python")
    assert (js.pre, js.post) == (PRE_JS, POST_JS)
    # Nothing to replay: refused before anything starts, naming the tasks and the way on.
    rc, doc, err = srl_cli(
        ["collect", task_file, "--collection", "gold", "--source", "gold_replay"], settings
    )
    assert rc == 8 and "2 of 2 tasks have none" in doc["error"]["message"], err
    assert "srl expert" in doc["error"]["message"]

    # 2. The teacher on them: verified against post in the jail, no expert to compare with.
    teach = f"teach-{uuid.uuid4().hex[:6]}"
    result = await _collect(client, settings, tmp_path, task_file.read_bytes(), teacher, teach)
    assert result.totals.verified_episodes == 1 and result.totals.failed_episodes == 0
    sessions = get_sessionmaker(settings.resolved_database_url)
    js_rows = [r for r in list_steps(sessions, teach) if r.task_id == js.task_id]
    assert [(r.step, r.verified, r.step_similarity) for r in js_rows] == [
        (1, False, None),
        (2, True, None),
    ]

    # 3. `srl expert`: the verified trajectory, step by step, each with the file after it.
    experts_file = tmp_path / "experts.jsonl"
    rc, doc, err = srl_cli(["expert", "--collection", teach, "--out", experts_file], settings)
    assert rc == 0, err
    assert (doc["experts"], doc["expert_steps"], doc["without"]) == (1, 2, [py.task_id])
    assert (doc["source"], doc["model"]) == ("teacher", "local")
    [expert_task] = parse_tasks(experts_file.read_bytes())
    assert isinstance(expert_task, SrlTask) and expert_task.task_id == js.task_id
    assert expert_task.expert is not None and expert_task.expert.collection == teach
    steps = expert_task.expert.steps
    assert [s.text_after for s in steps] == [MID_JS, POST_JS]
    assert [(s.action.pattern, s.action.rewrite) for s in steps] == [  # type: ignore[union-attr]
        (TO_EXPRESSION["pattern"], TO_EXPRESSION["rewrite"]),
        (TO_ARROW["pattern"], TO_ARROW["rewrite"]),
    ]

    # 4. Collections over the expert set: step n against the expert's step n.
    def follower(req: RecordedRequest) -> ScriptedReply:
        code = _code(req)
        # Metavariables renamed: the same action, spelled otherwise.
        if "function add(a, b) {" in code:
            return _answer({"pattern": "function $N($$$A) { return $R; }",
                            "rewrite": "const $N = function ($$$A) { return $R; };"},
                           "javascript")  # fmt: skip
        return _answer(TO_ARROW, "javascript")

    def shortcut(req: RecordedRequest) -> ScriptedReply:
        return _answer(AT_ONCE, "javascript")

    def idle(req: RecordedRequest) -> ScriptedReply:
        return _answer({"pattern": "function $F() {}", "rewrite": "function $F() {}"}, "javascript")

    expert_tasks = experts_file.read_bytes()
    scored = {}
    for name, answer in (("follow", follower), ("shortcut", shortcut), ("idle", idle)):
        collection = f"{name}-{uuid.uuid4().hex[:6]}"
        await _collect(client, settings, tmp_path, expert_tasks, answer, collection)
        scored[name] = [
            (r.step, r.verified, r.step_similarity, r.reward_total)
            for r in list_steps(sessions, collection)
        ]
    # Following the expert: each step equals the expert's step (1.0); done at step 2.
    (s1, s2) = scored["follow"]
    assert (s1[:3], s2[:3]) == ((1, False, 1.0), (2, True, 1.0))
    # Reaching post in one step is as good as the expert's step 1, and done.
    [(step, verified, similarity, total)] = scored["shortcut"]
    assert (step, verified, similarity) == (1, True, 1.0) and total == s2[3]
    # Doing nothing never comes near: three steps, each far below the expert's.
    idle_rows = scored["idle"]
    assert len(idle_rows) == 3 and not any(v for _, v, _, _ in idle_rows)
    assert all(sim is not None and sim <= 0.1 for _, _, sim, _ in idle_rows)
    assert max(t for *_, t in idle_rows) < min(s1[3], s2[3])
