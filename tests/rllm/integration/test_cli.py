"""The ``runllm`` CLI as a user runs it (a subprocess): exit codes per error class,
validate/inspect output, runs on the test dev server with a worker whose models config
points at a scripted OpenAI-compatible server, stats and exectime after runs, a worker
started by the CLI when none polls, and the embedded server started on demand."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.settings import Settings
from services.processes import free_port
from tests.support.scripted_ollama import ScriptedOllamaServer
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply
from tests.support.scripted_openai import models_yaml as scripted_models_yaml

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "rllm" / "unit" / "rllm_golden"
RUNLLM = [sys.executable, "-m", "cli.runllm"]
GOOD = {"summary": "Temporal keeps workflows durable.", "sentences": 1}
TEXT = "Temporal keeps workflows durable. Workers run them."


def models_yaml(base_url: str, ollama_url: str = "http://127.0.0.1:9") -> str:
    return (
        scripted_models_yaml(base_url) + "  olla:\n"
        "    litellm_model: ollama/smollm2:135m\n"
        f"    api_base: {ollama_url}\n"
    )


@pytest.fixture
def model_server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=ScriptedReply(content=json.dumps(GOOD))) as srv:
        yield srv


@pytest.fixture
def ollama() -> Iterator[ScriptedOllamaServer]:
    with ScriptedOllamaServer(chunks=3) as srv:
        yield srv


@pytest.fixture
def settings(
    settings: Settings,
    tmp_path: Path,
    model_server: ScriptedOpenAIServer,
    ollama: ScriptedOllamaServer,
) -> Settings:
    cfg = tmp_path / "models.yaml"
    cfg.write_text(models_yaml(model_server.base_url, ollama.base_url))
    return settings.model_copy(update={"models_config": cfg, "ollama_base_url": ollama.base_url})


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The CLI's environment: the same server, task queue, data dir and models as the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        {
            "KEEL_ENV": "test",
            "KEEL_TEMPORAL_ADDRESS": settings.temporal_address,
            "KEEL_TASK_QUEUE": settings.task_queue,
            "KEEL_DATA_DIR": str(settings.data_dir),
            "KEEL_MODELS_CONFIG": str(settings.models_config),
            "KEEL_OLLAMA_BASE_URL": settings.ollama_base_url,
            **extra,
        }
    )
    return env


async def runllm(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run the CLI without blocking the event loop (the test's worker lives on it)."""
    return await asyncio.to_thread(
        subprocess.run,
        [*RUNLLM, *args],
        env=env if env is not None else {**os.environ, "KEEL_ENV": "test"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def payload(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON document on stdout; the summary line, last on stderr.

    Notes may come before the summary: on a slow machine the test's worker can take longer
    than the CLI's 3 s to pick a run up, and the CLI then says it starts a worker of its
    own (CI saw this once).
    """
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(lines[0])
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        assert err[-1].startswith(f"error: {doc['error_type']}: "), proc.stderr
        assert [line for line in err if line.startswith("error: ")] == err[-1:], proc.stderr
        assert set(doc) == {
            "error_code", "error_type", "message", "details", "expected_schema",
            "received_payload", "recovery_hint", "doc_ref",
        }  # fmt: skip
    return doc


def app_file(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def summary_variant(**replace: str) -> str:
    text = (EXAMPLES / "summary.rllm").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


# -- no server needed ------------------------------------------------------------------


async def test_validate_and_inspect_outputs():
    v = await runllm(["validate", str(EXAMPLES / "compose_summary_keywords.rllm")])
    assert v.returncode == 0, v.stderr
    out = payload(v)
    assert out["ok"] is True and out["app"] == "compose_summary_keywords"
    assert out["files"] == [
        "summary.rllm",
        "extract_keywords.rllm",
        "compose_summary_keywords.rllm",
    ]
    assert out["models"] == {"summary.rllm": "local", "extract_keywords.rllm": "local"}
    assert out["graph_digest"].startswith("blake3:")

    i = await runllm(["inspect", str(EXAMPLES / "compose_summary_keywords.rllm")])
    tree = payload(i)
    assert tree["contracts"]["output_map"] == {
        "summary": "summarised.summary",
        "keywords": "keywords_of.keywords",
    }
    assert tree["llm"]["needs_llm"] is False
    assert [(e["alias"], e["child"]) for e in tree["graph"]["edges"]] == [
        ("summarised", "summary.rllm"),
        ("keywords_of", "extract_keywords.rllm"),
    ]
    kw = payload(await runllm(["inspect", str(EXAMPLES / "extract_keywords.rllm")]))
    assert [b["name"] for b in kw["python_blocks"]] == ["squash_whitespace", "dedupe"]
    assert kw["templates"]["prompt_variables"] == ["clean_text", "max_keywords"]

    human = await runllm(["inspect", "-v", str(EXAMPLES / "compose_summary_keywords.rllm")])
    assert human.returncode == 0
    assert "as summarised: exposes summary; text <- text" in human.stdout
    assert "run order: summary.rllm -> extract_keywords.rllm" in human.stdout


@pytest.mark.parametrize(
    ("file", "code", "error_code"),
    [
        ("broken/yaml_syntax.rllm", 10, "RLLM_PARSE_ERROR"),
        ("broken/missing_key.rllm", 11, "RLLM_METADATA_INVALID"),
        ("broken/bad_param.rllm", 12, "RLLM_LLM_PARAMS_INVALID"),
        ("broken/prompt_too_long.rllm", 15, "RLLM_CONTEXT_WINDOW_EXCEEDED"),
        ("compose/cycle_a.rllm", 17, "RLLM_DEPENDENCY_UNRESOLVED"),
        ("no_such_file.rllm", 10, "RLLM_PARSE_ERROR"),
    ],
)
async def test_load_errors_exit_with_their_class_code(file, code, error_code):
    for cmd in ("validate", "run"):
        proc = await runllm(
            [cmd, str(GOLDEN / file), "--input", "x"][: 2 if cmd == "validate" else 4]
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert payload(proc)["error_code"] == error_code


async def test_cycle_payload_names_the_cycle():
    doc = payload(await runllm(["validate", str(GOLDEN / "compose/cycle_a.rllm")]))
    assert doc["details"]["cycle"] == [
        "cycle_a.rllm",
        "cycle_b.rllm",
        "nested/cycle_c.rllm",
        "cycle_a.rllm",
    ]


async def test_usage_and_input_errors_need_no_server(tmp_path):
    bad_input = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "--input", '{"txt": "x"}'],
        env={**os.environ, "KEEL_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"},
    )
    assert bad_input.returncode == 13
    doc = payload(bad_input)
    assert doc["error_code"] == "RLLM_INPUT_SCHEMA_MISMATCH"
    assert doc["received_payload"] == {"txt": "x"}
    both = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "--input", "x", "--input-file", "in.json"]
    )
    assert both.returncode == 2 and payload(both)["error_code"] == "RLLM_USAGE_ERROR"
    missing = await runllm(["run", str(EXAMPLES / "summary.rllm"), "-f", str(tmp_path / "no")])
    assert missing.returncode == 2 and "cannot read the input file" in payload(missing)["message"]
    option = await runllm(["run", str(EXAMPLES / "summary.rllm"), "--max-retries", "99"])
    assert option.returncode == 2 and payload(option)["error_type"] == "UsageError"


async def test_unreachable_configured_server_is_an_internal_error():
    env = {**os.environ, "KEEL_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    proc = await runllm(["run", str(EXAMPLES / "summary.rllm"), "--input", TEXT], env=env)
    assert proc.returncode == 1
    doc = payload(proc)
    assert doc["error_code"] == "RLLM_INTERNAL_ERROR" and doc["error_type"] == "ServiceUnavailable"


# -- runs on the test server, worker in this process -----------------------------------


async def test_run_outputs_json_and_human(settings, worker, model_server, tmp_path):
    env = cli_env(settings)
    proc = await runllm(["run", str(EXAMPLES / "summary.rllm"), "--input", TEXT], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = payload(proc)
    assert doc["output"] == GOOD and doc["app"] == "summary" and doc["retries"] == 0
    assert doc["workflow_id"].startswith("rllm/summary/")
    sent = model_server.chat_requests[-1].json
    assert TEXT in sent["messages"][-1]["content"]

    in_file = tmp_path / "in.yaml"
    in_file.write_text(f"text: {TEXT}\nmax_sentences: 1\n")
    only = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "-f", str(in_file), "--output-only"], env
    )
    assert only.returncode == 0 and json.loads(only.stdout) == GOOD
    assert "at most 1 sentences" in model_server.chat_requests[-1].json["messages"][-1]["content"]

    human = await runllm(["run", "-v", str(EXAMPLES / "summary.rllm"), "-i", TEXT], env)
    assert human.returncode == 0, human.stderr
    assert "summary 0.1.0 on local: ok after 1 attempt (0 retries)" in human.stdout
    assert "attempt 1 (local): ok" in human.stdout
    assert "Started rllm/summary/" in human.stderr


async def test_recovery_then_stats_and_exectime(settings, worker, model_server):
    env = cli_env(settings)
    model_server.enqueue(ScriptedReply(content='{"summary": "x"}'))  # sentences missing
    proc = await runllm(["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT, "-v"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok after 2 attempts (1 retry)" in proc.stdout
    assert "attempt 1 (local): invalid" in proc.stdout
    assert await runllm(["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT], env)

    st = await runllm(["stats", str(EXAMPLES / "summary.rllm")], env)
    assert st.returncode == 0, st.stderr
    [entry] = payload(st)["apps"]
    [s] = entry["stats"]
    assert (s["app"], s["model"], s["runs"], s["successes"]) == ("summary", "local", 2, 2)
    assert s["avg_retries"] == 0.5 and s["output_compliance_pct"] == 100.0
    assert s["avg_prompt_tokens"] > 0 and s["schema_version"] >= 1
    none = payload(await runllm(["stats", str(EXAMPLES / "summary.rllm"), "-m", "olla"], env))
    assert none["apps"][0]["stats"] == []

    ex = payload(await runllm(["exectime", str(EXAMPLES / "summary.rllm")], env))
    assert ex["predicted_ms"] is not None and ex["predicted_ms"] > 0 and ex["missing"] == []
    assert ex["parts"][0]["basis"] == "latency" and ex["prompt_tokens"] is None
    long_text = " ".join([TEXT] * 40)
    scaled = payload(
        await runllm(["exectime", str(EXAMPLES / "summary.rllm"), "-i", long_text], env)
    )
    assert scaled["prompt_tokens"] > 400 and scaled["parts"][0]["basis"] == "tokens"
    composed = payload(
        await runllm(["exectime", str(EXAMPLES / "compose_summary_keywords.rllm")], env)
    )
    assert composed["predicted_ms"] is None
    assert set(composed["missing"]) >= {"compose_summary_keywords.rllm"}


async def test_run_time_errors_exit_with_their_class_code(settings, worker, model_server, tmp_path):
    env = cli_env(settings)
    model_server.enqueue(*[ScriptedReply(content="no json") for _ in range(3)])
    exhausted = await runllm(["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT], env)
    assert exhausted.returncode == 16, exhausted.stdout + exhausted.stderr
    doc = payload(exhausted)
    assert doc["error_code"] == "RLLM_RETRY_EXHAUSTED"
    assert [a["attempt"] for a in doc["details"]["attempts"]] == [1, 2, 3]

    small = app_file(
        tmp_path,
        "small.rllm",
        summary_variant(**{"max_context_window: 2048": "max_context_window: 300"}),
    )
    window = await runllm(["run", str(small), "-i", "word " * 300], env)
    assert window.returncode == 15, window.stdout + window.stderr
    assert payload(window)["details"]["max_context_window"] == 300

    post = app_file(
        tmp_path,
        "post.rllm",
        summary_variant(
            **{
                "=== recovery ===": "=== python name=spoil stage=post inputs=sentences "
                "outputs=sentences ===\nsentences = 'two'\n=== recovery ==="
            }
        ),
    )
    bad_output = await runllm(["run", str(post), "-i", TEXT], env)
    assert bad_output.returncode == 14, bad_output.stdout + bad_output.stderr
    assert payload(bad_output)["error_code"] == "RLLM_OUTPUT_SCHEMA_MISMATCH"

    boom = app_file(
        tmp_path,
        "boom.rllm",
        summary_variant(
            **{
                "=== recovery ===": "=== python name=boom stage=pre inputs=text outputs=n ===\n"
                "n = 1 / 0\n=== recovery ==="
            }
        ),
    )
    block = await runllm(["run", str(boom), "-i", TEXT], env)
    assert block.returncode == 18, block.stdout + block.stderr
    assert payload(block)["details"]["type"] == "ZeroDivisionError"

    missing = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT, "--model", "olla"], env
    )
    assert missing.returncode == 19, missing.stdout + missing.stderr
    assert payload(missing)["details"]["model"] == "smollm2:135m"

    unknown_model = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT, "--model", "nope"], env
    )
    assert unknown_model.returncode == 11
    assert payload(unknown_model)["details"]["known"] == ["local", "olla"]


async def test_run_takes_a_litellm_model_string(
    settings, worker, model_server, monkeypatch: pytest.MonkeyPatch
):
    """``--model openai/<model>``: no models.yaml entry; the worker reaches the server the
    environment names (LiteLLM's OPENAI_API_BASE and OPENAI_API_KEY)."""
    answer = {"summary": "From the environment's server.", "sentences": 1}
    with ScriptedOpenAIServer(default=ScriptedReply(content=json.dumps(answer))) as env_srv:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        monkeypatch.setenv("OPENAI_API_BASE", env_srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-keel-test-cli-key")
        env = cli_env(settings)
        args = ["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT]
        proc = await runllm([*args, "--model", "openai/env-model"], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = payload(proc)
        assert doc["output"] == answer and doc["model"] == "openai/env-model"
        assert [r.json["model"] for r in env_srv.chat_requests] == ["env-model"]

        valid = await runllm(["validate", str(EXAMPLES / "summary.rllm")], env)
        assert valid.returncode == 0, valid.stdout + valid.stderr
        assert payload(valid)["models"] == {"summary.rllm": "local"}
    assert model_server.chat_requests == []


async def test_ollama_auto_pull_reports_progress(settings, worker, ollama):
    env = cli_env(settings)
    proc = await runllm(
        ["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT, "--ollama-auto-pull"], env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ollama.pulls == ["smollm2:135m"]  # recommended_models of summary.rllm
    assert payload(proc)["output"] == GOOD


# -- the CLI starts what is missing --------------------------------------------------------


async def test_cli_starts_a_worker_when_none_polls(settings, model_server):
    env = cli_env(settings)  # no `worker` fixture: nobody polls this task queue
    proc = await runllm(["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT], env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert payload(proc)["output"] == GOOD
    assert "No worker picked up the run" in proc.stderr
    log = settings.data_dir / "logs" / "runllm-worker.log"
    assert "worker ready" in log.read_text()


@pytest.mark.slow
@pytest.mark.embedded_model
async def test_cli_starts_the_embedded_server_and_stops_it(settings, model_server, tmp_path):
    data = tmp_path / "embedded"
    env = cli_env(
        settings,
        KEEL_TEMPORAL_ADDRESS="",
        KEEL_DATA_DIR=str(data),
        KEEL_DEV_SERVER_PORT=str(free_port()),
        KEEL_DEV_SERVER_UI_PORT=str(free_port()),
        KEEL_API_PORT=str(free_port()),
        KEEL_MODEL_SERVER_PORT=str(free_port()),
    )
    start = time.monotonic()
    proc = await runllm(["run", str(EXAMPLES / "summary.rllm"), "-i", TEXT], env, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert payload(proc)["output"] == GOOD
    assert "(keel up)" in proc.stderr
    assert (data / "temporal.db").exists()
    assert not (data / "run" / "up.json").exists(), "keel up outlived the run"
    up = (data / "up.log").read_text()
    assert "Keel is down." in up, up
    print(f"embedded cold run: {time.monotonic() - start:.1f} s")


async def test_temporal_cli_starts_rllm_app_with_plain_json(settings, worker, model_server):
    """docs/runllm-cli.md: `temporal workflow start --type RllmApp` with a worker-relative path."""
    from services.processes import find_binary

    temporal = find_binary("temporal")
    addr = ["--address", settings.resolved_temporal_address]
    wid = f"rllm/summary/cli-{time.time_ns()}"
    body = {"path": "examples/summary.rllm", "input": {"text": TEXT, "max_sentences": 1}}
    start = await asyncio.to_thread(
        subprocess.run,
        [temporal, "workflow", "start", "--type", "RllmApp", "--task-queue", settings.task_queue,
         "--workflow-id", wid, "--input", json.dumps(body), *addr],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert start.returncode == 0, start.stderr
    result = await asyncio.to_thread(
        subprocess.run,
        [temporal, "workflow", "result", "--workflow-id", wid, "--output", "json", *addr],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "COMPLETED", doc
    assert doc["result"]["output"] == GOOD and doc["result"]["app"] == "summary"
    assert "at most 1 sentences" in model_server.chat_requests[-1].json["messages"][-1]["content"]
