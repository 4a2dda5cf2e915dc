"""The ``design`` CLI as a user runs it (subprocesses), against the session's dev server
and one ``keel worker`` that the module's tests share (as beside ``keel up``; each
``design run`` that must start its own worker waits 3 s for one, then pays its start):
one test runs on a task queue no worker polls, so ``design run`` starts one and stops it.
Output is JSON because stdout is a pipe, and the live event lines are on stderr. ``design
answer`` and ``design approve`` run from beside the following ``design run``, as from a
second terminal."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.local import reachable
from services.processes import ManagedProcess, free_port
from store.design_git import git, repo_path
from tests.design.unit.design_data import golden_cases

REPO = Path(__file__).resolve().parents[3]
DESIGN = [sys.executable, "-m", "cli.design"]
#: A guided form that leaves budget and regions open: the pipeline asks for regions.
PARTIAL_FORM: dict[str, Any] = {
    "cloud": "aws",
    "workload_types": ["batch"],
    "data_classification": "internal",
}
COMMENT = "too expensive, cut the cost"
# Project ids of their own: the dev server and its workflow ids are the whole session's
# (tests/design/integration/test_pipeline.py runs design/acme/ds1 too).
_RUN = uuid.uuid4().hex[:6]
ACME, ITER, BETA, GEN, FAIL = (f"{n}-{_RUN}" for n in ("acme", "iter", "beta", "gen", "fail"))


def cli_env(data_dir: Path, temporal_address: str) -> dict[str, str]:
    return {
        **os.environ,
        "KEEL_DATA_DIR": str(data_dir),
        "KEEL_TEMPORAL_ADDRESS": temporal_address,
        "KEEL_TASK_QUEUE": f"design-cli-{uuid.uuid4()}",
        "KEEL_METRICS_PORT": "0",
        "KEEL_USER": "alice",
    }


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, temporal_address: str
) -> Iterator[dict[str, str]]:
    """The module's data dir and task queue, with one ``keel worker`` polling it."""
    base = tmp_path_factory.mktemp("design-cli")
    shared = cli_env(base / "keel", temporal_address)
    log = base / "worker.log"
    worker = ManagedProcess(
        "keel worker", [sys.executable, "-m", "cli.keel", "worker"], log, env=shared
    )
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while "worker ready" not in (log.read_text(errors="replace") if log.exists() else ""):
            assert worker.running(), log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the shared keel worker never became ready"
            time.sleep(0.1)
        yield shared
    finally:
        worker.stop()


@pytest.fixture
def own_env(tmp_path: Path, temporal_address: str) -> dict[str, str]:
    """A data dir and a task queue of the test's own, that no worker polls."""
    return cli_env(tmp_path / "keel", temporal_address)


def design(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        DESIGN + args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def doc(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def follow(
    args: list[str], env: dict[str, str], on_line: Callable[[str], None], timeout: float = 300
) -> tuple[int, str, list[str]]:
    """Run ``design run ...`` and call ``on_line`` with each stderr line as it comes;
    its exit code, stdout and stderr lines."""
    proc = subprocess.Popen(
        DESIGN + args, env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            if line is None:
                break
            seen.append(line)
            on_line(line)
        assert proc.stdout is not None
        out = proc.stdout.read()
        return proc.wait(timeout=60), out, seen
    finally:
        if proc.poll() is None:
            # SIGINT, not SIGKILL: `design run` then stops the worker it started.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_questions_rejection_approval_show_diff(env: dict[str, str], tmp_path: Path) -> None:
    made = design(["new", ACME, "--name", "Acme churn"], env)
    assert made.returncode == 0, made.stderr
    assert doc(made) == {"project": ACME, "owner": "alice", "created": True}
    theirs = design(["new", ACME, "--as", "mallory"], env)
    assert theirs.returncode == 6 and doc(theirs)["error"]["type"] == "conflict"
    missing = design(["run", "nowhere", "--requirements", "x"], env)
    assert missing.returncode == 3 and doc(missing)["error"]["type"] == "not_found"

    side: list[subprocess.CompletedProcess[str]] = []

    def on_line(line: str) -> None:
        if line.strip().startswith(f"answer with: design answer {ACME} ds1"):
            # A value that does not validate is refused by the workflow, naming the field.
            side.append(design(["answer", ACME, "ds1", 'regions=["Mars 1"]'], env))
            side.append(
                design(["answer", ACME, "ds1", 'regions=["us-east-1"]', "budget_band=medium"], env)
            )
        elif f"gate plan-r1 waiting for approval: design approve {ACME} ds1" in line:
            side.append(design(["approve", ACME, "ds1"], env))  # alice asked: refused
            side.append(
                design(
                    ["approve", ACME, "ds1", "--reject", "--comment", COMMENT, "--as", "bob"], env
                )
            )
        elif "gate plan-r2 waiting for approval" in line:
            side.append(design(["approve", ACME, "ds1", "--as", "bob"], env))

    form = write_json(tmp_path / "form.json", PARTIAL_FORM)
    rc, out, lines = follow(
        ["run", ACME, "--intake", str(form), "--no-generate", "-d", "ds1"], env, on_line
    )
    assert rc == 0, "\n".join(lines)
    assert json.loads(out) == {
        "project": ACME,
        "decision_set": "ds1",
        "status": "completed",
        "version": 1,
        "archive_digest": None,
    }
    bad, answered, self_approval, rejected, approved = side
    assert bad.returncode == 5 and "regions" in doc(bad)["error"]["message"], bad.stderr
    assert answered.returncode == 0, answered.stderr
    assert self_approval.returncode == 5, self_approval.stderr
    assert "cannot decide" in doc(self_approval)["error"]["message"]
    assert rejected.returncode == 0, rejected.stderr
    assert doc(rejected)["round"] == 1 and doc(rejected)["gate"]["status"] == "rejected"
    assert approved.returncode == 0 and doc(approved)["round"] == 2, approved.stderr
    text = "\n".join(lines)
    # One line per event, with its node: coverage, questions, plan, cost, policy, gates.
    assert "[coverage_check] coverage 0." in text and "not covered (missing" in text
    assert "    ? regions: " in text
    assert "] answers from alice: budget_band, regions" in text
    assert "[planner] plan round 1: ingest=" in text and "[planner] plan round 2: " in text
    assert "[critic_cost] cost $" in text and "[policy_eval] policy " in text
    assert "[gate_hitl] gate plan-r1 rejected by bob" in text
    assert "[gate_hitl] gate plan-r2 approved by bob" in text
    assert "run complete: completed, version 1" in text

    shown = design(["show", ACME, "ds1"], env)
    assert shown.returncode == 0, shown.stderr
    view = doc(shown)
    assert view["status"] == "completed" and view["version"] == 1
    assert view["cost"]["monthly_usd"] > 0 and view["policy"]["overall"] in ("pass", "warn")
    assert view["validation"] is None and view["rows"]["approvals"] == 2
    assert ACME in {p["project"] for p in doc(design(["show"], env))["projects"]}


def test_iteration_diff(env: dict[str, str], tmp_path: Path) -> None:
    """A second decision set from an approved one: its Change Summary and cost delta."""
    assert design(["new", ITER], env).returncode == 0
    side: list[subprocess.CompletedProcess[str]] = []

    def approve_if_forced(line: str) -> None:
        # No gate unless §23.5 forces one (policy fail, a cost rise over the threshold).
        forced = re.search(rf"waiting for approval: design approve {ITER} (\S+)", line)
        if forced:
            side.append(design(["approve", ITER, forced.group(1), "--as", "bob"], env))

    base = dict(golden_cases()["batch_training"]["constraints"])
    form = write_json(tmp_path / "form.json", base)
    args = ["run", ITER, "--no-generate", "--no-require-approval"]
    rc, out, lines = follow([*args, "--intake", str(form)], env, approve_if_forced)
    assert rc == 0, "\n".join(lines)
    assert json.loads(out)["decision_set"] == "ds1"  # the default id: ds<N>
    first = doc(design(["show", ITER, "ds1"], env))["cost"]["monthly_usd"]

    more = write_json(tmp_path / "more.json", {"workload_types": ["batch", "online"]})
    rc2, out2, lines2 = follow(
        [*args, "--previous", "ds1", "--intake", str(more)], env, approve_if_forced
    )
    assert rc2 == 0, "\n".join(lines2)
    assert json.loads(out2)["decision_set"] == "ds2"
    assert any("] diff against ds1:" in line for line in lines2), lines2
    sets = doc(design(["show", ITER], env))["decision_sets"]
    assert [(d["id"], d["parent_id"]) for d in sets] == [("ds2", "ds1"), ("ds1", None)]

    diffed = design(["diff", ITER, "ds2"], env)
    assert diffed.returncode == 0, diffed.stderr
    d = doc(diffed)
    assert d["previous"] == "ds1"
    assert {"constraints", "cost", "plan"} <= set(d["state_keys_changed"]), d
    # The added workload, and the serving pattern the planner changed for it.
    assert d["changes"]["added"] == ["constraints.workload_types[1]"], d["changes"]
    changed = {c["path"]: (c["old"], c["new"]) for c in d["changes"]["changed"]}
    assert changed["plan.serve"][0] == "serve:sagemaker-batch-transform", changed
    assert d["cost_delta_usd"] == pytest.approx(d["monthly_usd"] - first)
    assert d["files_added"] == d["files_removed"] == d["files_modified"] == []
    no_diff = design(["diff", ITER, "ds1"], env)
    assert no_diff.returncode == 3 and "no previous decision set" in no_diff.stderr
    no_zip = design(["download", ITER, "ds1"], env)
    assert no_zip.returncode == 3 and "--no-generate" in no_zip.stderr


def test_rejection_without_comment_ends_rejected(own_env: dict[str, str], tmp_path: Path) -> None:
    """On a task queue no worker polls: ``design run`` starts one, and stops it."""
    env = own_env
    assert design(["new", BETA], env).returncode == 0
    side: list[subprocess.CompletedProcess[str]] = []

    def on_line(line: str) -> None:
        if "gate plan-r1 waiting" in line:
            side.append(design(["approve", BETA, "ds1", "--reject", "--as", "bob"], env))

    form = write_json(tmp_path / "form.json", golden_cases()["batch_training"]["constraints"])
    rc, out, lines = follow(["run", BETA, "--intake", str(form), "--no-generate"], env, on_line)
    assert rc == 7, "\n".join(lines)  # the documented exit code of a rejected plan
    assert any("No worker picked up the run" in line for line in lines), lines
    assert json.loads(out)["status"] == "rejected"
    assert side[0].returncode == 0, side[0].stderr
    late = design(["approve", BETA, "ds1", "--as", "bob"], env)
    assert late.returncode == 3 and "no open gate: the run is completed" in late.stderr


def test_show_lists_a_failed_run_as_failed_not_submitted(
    env: dict[str, str], tmp_path: Path
) -> None:
    assert design(["new", FAIL], env).returncode == 0
    form = write_json(tmp_path / "form.json", {**PARTIAL_FORM, "regions": ["Mars 1"]})
    rc, out, lines = follow(["run", FAIL, "--intake", str(form), "-d", "ds1"], env, lambda _: None)
    assert rc != 0 and json.loads(out)["status"] == "failed", "\n".join(lines)
    # The row was noted submitted and the run never persisted: the list asks Temporal.
    listed = design(["show", FAIL], env)
    assert listed.returncode == 0, listed.stderr
    assert [(d["id"], d["status"]) for d in doc(listed)["decision_sets"]] == [("ds1", "failed")]
    one = design(["show", FAIL, "ds1"], env)
    assert one.returncode == 0 and doc(one)["status"] == "failed", one.stderr


def test_generated_repository_download(env: dict[str, str], tmp_path: Path) -> None:
    """The one run with codegen and the validators (about a minute)."""
    assert design(["new", GEN], env).returncode == 0
    form = write_json(tmp_path / "form.json", golden_cases()["batch_training"]["constraints"])
    rc, out, lines = follow(
        ["run", GEN, "--intake", str(form), "--no-require-approval"], env, lambda _: None, 600
    )
    assert rc == 0, "\n".join(lines)
    result = json.loads(out)
    assert result["status"] == "completed" and result["archive_digest"]
    text = "\n".join(lines)
    assert "[codegen] codegen: " in text and "[validators] validators: secrets passed" in text
    assert f"download with design download {GEN} ds1" in text

    view = doc(design(["show", GEN, "ds1"], env))
    # Nothing failed; a validator with nothing to check (no Dockerfile) is not_run.
    checks = view["validation"]
    assert checks and "failed" not in checks.values(), checks
    assert {checks[v] for v in ("secrets", "ruff", "mypy", "pytest", "hcl", "smoke")} == {"passed"}
    # The smoke's output is in `design show`: metrics, a prediction per entry point, drift.
    smoke = view["smoke"]
    assert smoke["status"] == "passed" and smoke["metrics"] and smoke["drift"], smoke
    assert {p["entry_point"] for p in smoke["predictions"]} >= {"fastapi"}, smoke
    shown = design(["show", GEN, "ds1", "--text"], env)
    assert "smoke: passed" in shown.stdout, shown.stdout
    target = tmp_path / "out" / "repo.zip"
    got = design(["download", GEN, "ds1", "-o", str(target)], env)
    assert got.returncode == 0, got.stderr
    assert doc(got)["digest"] == result["archive_digest"]
    assert doc(got)["validation"] == "passed" and doc(got)["failed_validators"] == []
    assert view["archive_validation"] == "passed" and view["failed_validators"] == []
    with zipfile.ZipFile(io.BytesIO(target.read_bytes())) as z:
        names = set(z.namelist())
        assert z.testzip() is None
    # The validated tree: the SBOM is in it, the validators' own reports are not.
    assert {"README.md", "services/serve/app.py", "reports/sbom.cdx.json"} <= names
    assert "reports/ruff.json" not in names

    # A second region and ten times the data: `design diff` names the Terraform resources
    # and the cost lines that changed.
    side: list[subprocess.CompletedProcess[str]] = []

    def approve_if_forced(line: str) -> None:
        forced = re.search(rf"waiting for approval: design approve {GEN} (\S+)", line)
        if forced:
            side.append(design(["approve", GEN, forced.group(1), "--as", "bob"], env))

    more = write_json(
        tmp_path / "more.json",
        {"regions": ["eu-west-1", "eu-central-1"], "throughput": {"data_gb_per_day": 2000}},
    )
    # Two validators only: this round is about the diff (`--validator`, for quick rounds).
    rc2, out2, lines2 = follow(
        ["run", GEN, "--previous", "ds1", "--intake", str(more), "--no-require-approval",
         "--validator", "wiring", "--validator", "hcl"],
        env,
        approve_if_forced,
        600,
    )  # fmt: skip
    assert rc2 == 0, "\n".join(lines2)
    assert json.loads(out2)["decision_set"] == "ds2"
    second = doc(design(["show", GEN, "ds2"], env))["validation"]
    assert {v for v, s in second.items() if s == "passed"} == {"hcl", "wiring"}, second
    assert set(second.values()) == {"passed", "not_run"}, second
    unknown = design(["run", GEN, "--previous", "ds2", "--validator", "lint"], env)
    assert unknown.returncode != 0 and "unknown validator(s) lint" in unknown.stdout, unknown
    repo = repo_path(Path(env["KEEL_DATA_DIR"]) / "design" / "repos", GEN)
    git_changes = [
        ln
        for ln in git(repo, "diff", "--name-status", "--no-renames", "ds/ds1", "ds/ds2")
        .stdout.strip()
        .splitlines()
        if not ln.endswith("\tplan.md")
    ]
    assert git_changes
    for args in (["diff", GEN, "ds2"], ["diff", GEN, "ds2", "--against", "ds1"]):
        diffed = design(args, env)
        assert diffed.returncode == 0, diffed.stderr
        d = doc(diffed)
        assert d["previous"] == "ds1"
        # The files from the project's git history: ds2's commit against ds1's, less the
        # plan.md every commit adds (the Change Summary, not a file of the repository).
        changed_files = {p: s for s, p in (ln.split("\t") for ln in git_changes)}
        assert {
            "added": d["files_added"],
            "removed": d["files_removed"],
            "modified": d["files_modified"],
        } == {
            kind: sorted(p for p, s in changed_files.items() if s == letter)
            for kind, letter in (("added", "A"), ("removed", "D"), ("modified", "M"))
        }
        assert "reports/diff.json" in d["files_added"] and "plan.md" not in d["files_modified"]
        added = {r["address"]: r for r in d["terraform"]["added"]}
        assert "module.ingest_eu_central_1.aws_s3_bucket.landing" in added
        assert {r["region"] for r in added.values()} == {"eu-central-1"}
        assert d["terraform"]["removed"] == []
        changed = {r["address"] for r in d["terraform"]["changed"]}
        # The Glue job's workers follow the region's glue_dpu: ten times the data.
        assert "module.transform_eu_west_1.aws_glue_job.transform" in changed
        lines = {(c["capability"], c["resource"], c["region"]): c for c in d["cost_lines"]}
        glue = lines[("transform", "glue_dpu", "eu-west-1")]
        assert glue["new_quantity"] > glue["old_quantity"] and glue["delta_usd"] > 0
        assert lines[("ingest", "s3_storage", "eu-central-1")]["old_usd"] is None
        assert d["cost_delta_usd"] == pytest.approx(sum(c["delta_usd"] for c in d["cost_lines"]))
    text = design(["diff", GEN, "ds2", "--against", "ds1", "--text"], env)
    assert text.returncode == 0, text.stderr
    assert "terraform resources added" in text.stdout
    assert "+ module.ingest_eu_central_1.aws_s3_bucket.landing [eu-central-1]" in text.stdout
    assert "~ transform glue_dpu [eu-west-1]: " in text.stdout


def test_answer_never_starts_servers(tmp_path: Path) -> None:
    """With nothing on the embedded address, `design answer` fails at once and says how to
    start Keel; it does not start `keel up` (no run can be waiting on a server that is
    down), as it did before."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "KEEL_TEMPORAL_ADDRESS"},
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        "KEEL_DEV_SERVER_PORT": str(port),
        "KEEL_METRICS_PORT": "0",
        "KEEL_USER": "alice",
    }
    project = f"down-{_RUN}"
    assert design(["new", project], env).returncode == 0
    answered = design(["answer", project, "ds1", "regions=us-east-1"], env, timeout=60)
    assert answered.returncode == 1, answered.stderr
    assert "keel up" in answered.stderr and f"127.0.0.1:{port}" in answered.stderr
    assert not (tmp_path / "keel" / "up.log").exists()
    assert not reachable(f"127.0.0.1:{port}")
