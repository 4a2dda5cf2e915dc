"""Two ``keel worker`` processes on one task queue share an SRL collection and design runs;
one is SIGKILLed while it runs SRL steps and the other finishes everything: no step, run,
record or artifact lost, none written twice, and the model asked again only for what was in
flight on the killed worker. (The MRP job's version is tests/mrp/faults/test_two_workers.py.)

Made deterministic with holds, not sleeps:

* SRL (teacher, two steps a task): the scripted teacher answers every task's first step
  with an action that changes nothing, and holds its answer to the second step (it knows it
  by the state the first one left in the prompt) until the test releases it. Once every
  task waits there, every episode has recorded step 1 and is inside step 2's
  ``srl.generate`` on one of the workers, with its request sent.
* design (guided form, ``codegen="litellm"``): each run's form leaves fields open, so it
  stops at ``adaptive_questions`` and waits for Update ``answers`` with no activity in
  flight. The answers go in after the kill, so codegen, the validators and persist run on
  whichever worker is left; the runs whose workflow lived on the killed worker move over.

The worker killed is one running a held ``srl.generate`` that had already completed some
activity, so both workers' identities are in the histories. Its steps are retried on the
survivor after the 10 s heartbeat timeout; its workflows move after the 10 s sticky
schedule-to-start timeout. Counted afterwards: step rows (two per task, each once), the
collection's totals, the teacher's requests (2 a task, plus one for each step in flight on
the killed worker), each run's decision set, agent runs, artifact rows and archive, and the
coder's requests (one a run).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import threading
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from client import design as design_client
from client.design import start_design
from client.srl import start_collection, upload_tasks
from keel.design.steps import DesignAnswers, DesignInput, DesignResult
from keel.design.validation import tree_digest
from keel.digest import digest_bytes
from keel.settings import Settings
from keel.srl.steps import CollectionInput, CollectionResult
from services.processes import ManagedProcess, TemporalDevServer
from store import design as design_store
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.design.unit.design_data import golden_cases
from tests.support.design_repo import MODEL_FILES
from tests.support.faults import activity_attempts, sigkill, spawn_worker, wait_until
from tests.support.scripted_openai import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedReply,
    models_yaml,
)
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl

pytestmark = pytest.mark.slow  # waits out the dead worker's heartbeat and sticky timeouts

TASKS = 4
RUNS = 3
#: A well-formed first step that changes nothing (not verified, so the episode goes on);
#: its decision shows in the second step's prompt.
LOOK_FIRST = (
    "<think>look first</think>"
    '<action>{"pattern": "divide($A, $B)", "rewrite": "divide($A, $B)", "language": "python"}'
    '</action><state_update>{"decisions": ["looked at the call first"]}</state_update>'
)
BATCH: dict[str, Any] = golden_cases()["batch_training"]["constraints"]
#: The guided form: too little to cover the intake, so the run asks for the rest.
FORM = {k: BATCH[k] for k in ("cloud", "workload_types", "data_classification")}
ANSWERS = {k: v for k, v in BATCH.items() if k not in FORM}


def two_models(teacher_url: str, coder_url: str) -> str:
    """``local`` (the default: the SRL teacher) and ``coder`` (design's codegen model)."""
    coder = models_yaml(coder_url).split("  local:\n", 1)[1]
    return models_yaml(teacher_url) + "  coder:\n" + coder


def started_or_exited(worker: ManagedProcess, log: Path) -> bool:
    return not worker.running() or "worker ready" in log.read_text(errors="replace")


def pid_of(identity: str) -> str:
    return identity.split("@")[0]


async def started_identities(handles: list[WorkflowHandle[Any, Any]]) -> set[str]:
    """The worker PIDs in the ``ActivityTaskStarted`` events of these workflows."""
    found: set[str] = set()
    for handle in handles:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                found.add(pid_of(event.activity_task_started_event_attributes.identity))
    return found


async def workflow_task_identities(handle: WorkflowHandle[Any, Any]) -> set[str]:
    """The worker PIDs that have run workflow tasks of this workflow."""
    return {
        pid_of(event.workflow_task_started_event_attributes.identity)
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    }


async def test_two_workers_share_srl_and_design_and_one_killed_loses_and_doubles_nothing(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
) -> None:
    release = threading.Event()

    def teach(req: RecordedRequest) -> ScriptedReply:
        if "looked at the call first" in json.dumps(req.json):
            return ScriptedReply(content=SWAP_ANSWER, hold=release)
        return ScriptedReply(content=LOOK_FIRST)

    codegen = ScriptedReply(content=json.dumps({"files": MODEL_FILES}))
    with (
        ScriptedOpenAIServer(default=teach) as teacher,
        ScriptedOpenAIServer(default=codegen) as coder,
    ):
        try:
            await scenario(client, settings, tmp_path, spawned, teacher, coder, release)
        finally:
            release.set()


async def scenario(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
    teacher: ScriptedOpenAIServer,
    coder: ScriptedOpenAIServer,
    release: threading.Event,
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(two_models(teacher.base_url, coder.base_url))
    settings = settings.model_copy(update={"models_config": models})
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [spawn_worker(settings, log, spawned) for log in logs]  # both start at once
    for w, log in zip(workers, logs, strict=True):
        await wait_until(
            functools.partial(started_or_exited, w, log),
            timeout_s=120,
            what="both workers to start",
        )
        assert w.running(), log.read_text()
    pids = {str(w.pid) for w in workers}

    async def polling() -> bool:
        for kind in (
            TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        ):
            desc = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=settings.task_queue),
                    task_queue_type=kind,
                )
            )
            if not pids <= {pid_of(p.identity) for p in desc.pollers}:
                return False
        return True

    await wait_until(polling, timeout_s=60, what="both workers among the queue's pollers")

    # An SRL collection and design runs start together; both workers pick them up.
    collection = f"two-{uuid.uuid4().hex[:8]}"
    digest, count = upload_tasks(
        artifact_store_from_settings(settings), tasks_jsonl(divide_tasks(TASKS))
    )
    inp = CollectionInput(
        collection=collection, tasks_digest=digest, task_count=count,
        source="teacher", model="local", window=TASKS, max_steps=2,
        step_mode="free_running",  # step 2 goes on from step 1's unchanged file
    )  # fmt: skip
    projects = [f"p-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    # Two validators, one of them jailed: this test is about the workers (every validator
    # runs on the generated shapes in tests/design/integration/test_validators.py).
    design: dict[str, Any] = {
        "decision_set": "ds1", "requester": "alice", "intake": FORM,
        "require_approval": False, "codegen": "litellm", "codegen_model": "coder",
        "validators": ["ruff", "pytest"],
    }  # fmt: skip
    runs = [DesignInput(project=p, **design) for p in projects]
    started = await asyncio.gather(
        start_collection(client, inp, task_queue=settings.task_queue),
        *(start_design(client, r, task_queue=settings.task_queue) for r in runs),
    )
    handle, designs = started[0], list(started[1:])
    episodes = [client.get_workflow_handle(f"srl/{collection}/swap-{i}") for i in range(TASKS)]

    async def designs_wait_for_answers() -> bool:
        for d, p in zip(designs, projects, strict=True):
            try:
                status = await design_client.status(client, p, "ds1")
            except RPCError:
                return False  # no worker answered the query in time (a loaded machine)
            if status is None or status.phase != "waiting_for_answers":
                return False
            if (await d.describe()).raw_description.pending_activities:
                return False
        return True

    await wait_until(
        lambda: teacher.holding == TASKS,
        timeout_s=120,
        what="every episode inside step 2's srl.generate, its request held",
        interval_s=0.1,
    )
    await wait_until(
        designs_wait_for_answers,
        timeout_s=60,
        what="every design run waiting for answers, no activity in flight",
        interval_s=0.1,
    )
    assert len(teacher.chat_requests) == 2 * TASKS and len(coder.chat_requests) == 0

    # The generates in flight, by worker; the victim runs some and has completed others.
    held: dict[str, int] = {}
    for ep in episodes:
        desc = await ep.describe()
        for act in desc.raw_description.pending_activities:
            assert act.activity_type.name == "srl.generate", act
            if act.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                who = pid_of(act.last_worker_identity)
                held[who] = held.get(who, 0) + 1
    assert sum(held.values()) == TASKS, held
    # Nothing else is in flight: srl.window is done, the design runs wait for answers.
    assert not (await handle.describe()).raw_description.pending_activities
    ran = await started_identities([handle, *episodes, *designs])
    hosts = [await workflow_task_identities(d) for d in designs]
    # Preferably one that also runs design workflows, so that they move too.
    candidates = sorted(
        (sum(pid in h for h in hosts), n, pid) for pid, n in held.items() if pid in ran
    )
    assert candidates, f"no worker both holds a step and has completed one: {held}, {ran}"
    victim_pid = candidates[-1][2]
    victim = next(w for w in workers if str(w.pid) == victim_pid)
    survivor = next(w for w in workers if w is not victim)
    in_flight = held[victim_pid]
    await sigkill(victim)

    sessions = get_sessionmaker(settings.resolved_database_url)
    rows = list_steps(sessions, collection)
    assert sorted(r.step_key for r in rows) == [f"swap-{i}#1" for i in range(TASKS)]
    assert not any(r.verified for r in rows)

    # Let everything go on: the held answers (the killed worker's go to dead sockets),
    # and each design run's answers (a run that lived on the killed worker moves over).
    release.set()
    answered = await asyncio.wait_for(
        asyncio.gather(
            *(
                d.execute_update("answers", DesignAnswers(answers=ANSWERS, actor="bob"))
                for d in designs
            )
        ),
        timeout=120,
    )
    assert len(answered) == RUNS
    result: CollectionResult = await asyncio.wait_for(handle.result(), timeout=180)
    results: list[DesignResult] = await asyncio.wait_for(
        asyncio.gather(*(d.result() for d in designs)), timeout=180
    )
    assert survivor.running()

    # SRL: every task's two steps, each recorded once; step 2 verified everywhere.
    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.verified_episodes, t.failed_episodes) == (
        TASKS, 2 * TASKS, TASKS, TASKS, 0,
    )  # fmt: skip
    rows = list_steps(sessions, collection)
    keys = [r.step_key for r in rows]
    assert sorted(keys) == sorted(f"swap-{i}#{s}" for i in range(TASKS) for s in (1, 2))
    assert all(r.verified == r.step_key.endswith("#2") for r in rows)
    # The teacher: two requests a task, and one more for each step that was in flight on
    # the killed worker (its held request never answered; the retry asks again).
    assert len(teacher.chat_requests) == 2 * TASKS + in_flight, (in_flight, held)
    # In the histories: the killed worker's steps 2 were attempted twice, nothing else.
    tries = [a for ep in episodes for a in await activity_attempts(ep)]
    assert sorted(tries) == sorted(
        [("srl.generate", 1)] * (2 * TASKS - in_flight)
        + [("srl.generate", 2)] * in_flight
        + [("srl.apply", 1)] * (2 * TASKS)
    ), tries

    # design: every run completed once, with its record, its agent runs and its archive.
    artifacts = artifact_store_from_settings(settings)
    for d, p, r in zip(designs, projects, results, strict=True):
        assert r.status == "completed", r
        assert r.constraints.model_dump(mode="json", exclude_defaults=True) == BATCH
        assert r.file_count == len(MODEL_FILES) and r.version == 1 and r.archive_digest
        assert len(design_store.decision_sets_of(sessions, p)) == 1
        row = design_store.decision_set(sessions, p, "ds1")
        assert row is not None and (row["status"], row["version"]) == ("completed", 1)
        counts = design_store.count_rows(sessions, p, "ds1")
        assert counts["agent_runs"] == len(r.nodes_run), (counts, r.nodes_run)
        assert counts["artifacts"] == r.file_count + 1  # the files and the archive
        stored = design_store.artifacts_of(sessions, p, "ds1")
        (archive_row,) = [a for a in stored if a["kind"] == "archive"]
        assert archive_row["digest"] == r.archive_digest
        archive = artifacts.get_bytes(r.archive_digest)
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            shipped = {n: z.read(n) for n in z.namelist()}
        assert r.validated_tree_digest == tree_digest(shipped)
        assert {k: v.encode() for k, v in MODEL_FILES.items()}.items() <= shipped.items()
        files = {a["path"]: a["digest"] for a in stored if a["kind"] != "archive"}
        assert sorted(files) == sorted(MODEL_FILES)
        assert all(digest_bytes(shipped[path]) == dg for path, dg in files.items())
        # Each design activity ran once: none was in flight at the kill.
        assert all(n == 1 for _, n in await activity_attempts(d)), await activity_attempts(d)
    # The coder: one request a run (no codegen was in flight at the kill).
    assert len(coder.chat_requests) == RUNS

    # The runs that lived on the killed worker went on on the survivor.
    for d, before in zip(designs, hosts, strict=True):
        if victim_pid in before:
            assert str(survivor.pid) in await workflow_task_identities(d)
    # Both workers ran activities: the victim before the kill, the survivor after.
    ran = await started_identities([handle, *episodes, *designs])
    assert {victim_pid, str(survivor.pid)} <= ran, ran
