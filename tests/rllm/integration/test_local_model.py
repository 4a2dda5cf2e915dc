"""The three example apps end to end against the embedded local model (SmolLM2-135M on
llama.cpp), through the real worker and the ``RllmApp`` workflow: nothing scripted.

The model's answers are constrained by the output schema (``response_format`` with
``json_object`` and the schema, which llama.cpp turns into a grammar), so even this tiny
model answers schema-valid JSON; the tests check shape and typing, not wording.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from keel.rllm.run import RllmRunInput, RllmRunResult, workflow_id_for
from keel.settings import Settings
from services.model_server import LocalModelServer
from store.db import get_sessionmaker
from store.files import bundle_files
from store.rllm_stats import get_stats
from workers.main import build_worker
from workflows.rllm import RllmApp

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama_cpp is not installed (uv sync --extra local-model)",
    ),
]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TEXT = (
    "Temporal is a durable execution platform. A workflow keeps its state when a worker "
    "crashes, and it resumes on another worker from the last recorded step. Teams use it "
    "to run long business processes and AI pipelines reliably."
)


@pytest.fixture
async def local_worker(
    client: Client, settings: Settings, local_model_server: LocalModelServer, tmp_path: Path
) -> AsyncIterator[tuple[Worker, Settings]]:
    models = tmp_path / "models.yaml"
    models.write_text(
        "default: local\n"
        "models:\n"
        "  local:\n"
        "    litellm_model: openai/smollm2\n"
        f"    api_base: {local_model_server.base_url}\n"
        "    params: {temperature: 0.0, max_tokens: 256}\n"
        "    input_cost_per_token: 0.0\n"
        "    output_cost_per_token: 0.0\n"
        "    structured_output: json_object_schema\n"
    )
    s = settings.model_copy(update={"models_config": models})
    async with build_worker(client, s) as w:
        yield w, s


async def run(client: Client, settings: Settings, name: str) -> RllmRunResult:
    handle = await client.start_workflow(
        RllmApp.run,
        RllmRunInput(path=name, files=bundle_files(EXAMPLES / name), input=TEXT),
        id=workflow_id_for(Path(name).stem, str(uuid.uuid4())),
        task_queue=settings.task_queue,
    )
    return await handle.result()


async def test_examples_run_on_the_local_model(
    client: Client, local_worker: tuple[Worker, Settings]
) -> None:
    _, settings = local_worker

    summary = await run(client, settings, "summary.rllm")
    assert isinstance(summary.output["summary"], str) and summary.output["summary"].strip()
    assert isinstance(summary.output["sentences"], int) and summary.output["sentences"] >= 1
    assert summary.model == "local" and summary.usage.completion_tokens > 0

    keywords = await run(client, settings, "extract_keywords.rllm")
    words = keywords.output["keywords"]
    assert isinstance(words, list) and 1 <= len(words) <= 5  # trimmed by the post block
    assert all(isinstance(w, str) and w.strip() for w in words)
    assert len({w.lower() for w in words}) == len(words)  # deduplicated by the post block

    composed = await run(client, settings, "compose_summary_keywords.rllm")
    assert set(composed.output) == {"summary", "keywords"}
    assert composed.output["summary"] == composed.children["summarised"].output["summary"]
    assert composed.output["keywords"] == composed.children["keywords_of"].output["keywords"]
    assert composed.usage.total_tokens == sum(
        c.usage.total_tokens for c in composed.children.values()
    )

    for r in (summary, keywords, composed):  # shown with -s / in failure reports
        print(r.app, r.output, "retries:", r.retries, "tokens:", r.usage.total_tokens)

    sessions = get_sessionmaker(settings.resolved_database_url)
    for app, runs in (("summary", 2), ("extract_keywords", 2), ("compose_summary_keywords", 1)):
        (stats,) = get_stats(sessions, app, "local")
        assert (stats.runs, stats.successes) == (runs, runs), app
