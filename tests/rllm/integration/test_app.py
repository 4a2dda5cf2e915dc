"""The ``RllmApp`` workflow end to end: real dev server, real worker, a scripted OpenAI
server over HTTP, real nsjail for Python blocks, real SQLite for stats.

The model's answers are scripted, so each test knows exactly what the model said and
checks what the workflow did with it: the recovery prompt it sent, the payload it
failed with, the steps its history shows, the stats row it wrote.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.llm import LLMGateway
from activities.rllm import RllmActivities
from keel.rllm.errors import (
    EXIT_CODES,
    ContextWindowExceededError,
    DependencyResolutionError,
    InputSchemaError,
    LLMParamValidationError,
    PythonBlockExecutionError,
    RetryExhaustedError,
    error_from_payload,
)
from keel.rllm.run import RllmRunInput, RllmRunResult, workflow_id_for
from keel.settings import Settings
from sandbox import SandboxConfig, SandboxLimits
from sandbox.models import JailSettings
from store.db import get_sessionmaker, init_db
from store.files import bundle_files, load_models_config
from store.rllm_stats import get_stats, list_runs
from tests.support.history import activity_names
from tests.support.pydantic_schemas import TicketIn, TicketOut, ticket_app
from tests.support.scripted_openai import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from workflows.rllm import RllmApp

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TEXT = (
    "Temporal keeps workflow state durable. Workers can crash and restart. "
    "The workflow resumes where it stopped."
)
SUMMARY_OK = '{"summary": "Workflows survive crashes.", "sentences": 1}'

SMALL_BLOCK_LIMITS = SandboxLimits(
    wall_time_s=5,
    cpu_time_s=2,
    memory_mb=256,
    max_processes=16,
    max_file_size_mb=1,
    max_output_bytes=64 * 1024,
    tmpfs_size_mb=2,
    workspace_size_mb=4,
)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def llm() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=ScriptedReply(content=SUMMARY_OK)) as srv:
        yield srv


@pytest.fixture
def rllm_settings(settings: Settings, llm: ScriptedOpenAIServer, tmp_path: Path) -> Settings:
    write_models_config(tmp_path / "models.yaml", llm.base_url)
    return settings.model_copy(update={"models_config": tmp_path / "models.yaml"})


@pytest.fixture
def sandbox_base() -> Iterator[Path]:
    """A jail base dir the sandbox can traverse (pytest's tmp_path sits under a 0700 dir)."""
    d = Path(tempfile.mkdtemp(prefix="keel-rllm-test-"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def make_worker(
    client: Client,
    settings: Settings,
    *,
    sandbox_config: SandboxConfig | None = None,
    block_limits: SandboxLimits | None = SMALL_BLOCK_LIMITS,
) -> Worker:
    init_db(settings.resolved_database_url)
    sessions = get_sessionmaker(settings.resolved_database_url)
    gateway = LLMGateway(load_models_config(settings.models_config))
    acts = RllmActivities(
        gateway, sessions, sandbox_config=sandbox_config, block_limits=block_limits
    )
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[RllmApp],
        activities=acts.all(),
    )


@pytest.fixture
async def rllm_worker(client: Client, rllm_settings: Settings) -> AsyncIterator[Worker]:
    async with make_worker(client, rllm_settings) as w:
        yield w


# -- helpers -------------------------------------------------------------------------------


def app_text(
    name: str = "probe",
    *,
    prompt: str = "Answer about {{ text }}.\n",
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    llm_params: dict[str, Any] | None = None,
    window: int = 2048,
    extra: str = "",
    sections: str = "",
) -> str:
    """A small valid app; keyword arguments change one part at a time."""
    ins = input_schema or {
        "type": "object",
        "additionalProperties": False,
        "required": ["text"],
        "properties": {"text": {"type": "string", "minLength": 1}},
    }
    outs = output_schema or {
        "type": "object",
        "additionalProperties": False,
        "required": ["answer"],
        "properties": {"answer": {"type": "string", "minLength": 1}},
    }
    params = llm_params or {"temperature": 0, "max_tokens": 100}
    head = (
        "---\n"
        f"name: {name}\n"
        "description: A test app.\n"
        "version: 1.0.0\n"
        "author: tests\n"
        f"max_context_window: {window}\n"
        f"input_schema: {json.dumps(ins)}\n"
        f"output_schema: {json.dumps(outs)}\n"
        "llm: {provider: keel, model: local}\n"
        f"llm_params: {json.dumps(params)}\n"
        f"{extra}"
        "---\n"
    )
    return head + prompt + sections


async def start(
    client: Client,
    settings: Settings,
    path: str,
    files: dict[str, str],
    input: Any,
    **kw: Any,
) -> WorkflowHandle[Any, RllmRunResult]:
    name = Path(path).stem
    return await client.start_workflow(
        RllmApp.run,
        RllmRunInput(path=path, files=files, input=input, **kw),
        id=workflow_id_for(name, str(uuid.uuid4())),
        task_queue=settings.task_queue,
    )


async def run_app(
    client: Client, settings: Settings, path: str, files: dict[str, str], input: Any, **kw: Any
) -> tuple[RllmRunResult, WorkflowHandle[Any, RllmRunResult]]:
    handle = await start(client, settings, path, files, input, **kw)
    return await handle.result(), handle


async def failure(
    client: Client, settings: Settings, path: str, files: dict[str, str], input: Any, **kw: Any
) -> tuple[ApplicationError, dict[str, Any], WorkflowHandle[Any, RllmRunResult]]:
    handle = await start(client, settings, path, files, input, **kw)
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    cause = info.value.cause
    assert isinstance(cause, ApplicationError), repr(cause)
    payload = cause.details[0]
    assert isinstance(payload, dict)
    return cause, payload, handle


def user_prompt(req: RecordedRequest) -> str:
    return str(req.json["messages"][-1]["content"])


def stats_db(settings: Settings) -> Any:
    return get_sessionmaker(settings.resolved_database_url)


# -- the happy path ------------------------------------------------------------------------


async def test_success_first_try(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    files = bundle_files(EXAMPLES / "summary.rllm")
    result, handle = await run_app(client, rllm_settings, "summary.rllm", files, TEXT)

    assert result.output == {"summary": "Workflows survive crashes.", "sentences": 1}
    assert (result.app, result.version, result.model) == ("summary", "0.1.0", "local")
    assert len(result.attempts) == 1 and result.attempts[0].ok and result.retries == 0
    assert result.usage.prompt_tokens == 5 and result.usage.completion_tokens == 3
    assert result.llm_latency_ms > 0

    # One call: the rendered prompt, the app's params, JSON mode with the schema.
    (req,) = llm.chat_requests
    body = req.json
    assert "Summarise the text in at most 2 sentences." in user_prompt(req)  # default filled
    assert TEXT in user_prompt(req)
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0, 200, 7)
    assert body["response_format"]["type"] == "json_object"
    assert body["response_format"]["schema"]["required"] == ["summary", "sentences"]

    assert await activity_names(handle) == ["rllm.load", "rllm.generate", "rllm.record_stats"]


async def test_an_app_may_opt_out_of_structured_output(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    """``structured_output: false`` in the frontmatter: JSON mode, no schema sent; the
    answer is still checked against the schema."""
    text = (EXAMPLES / "summary.rllm").read_text()
    assert text.startswith("---\n")
    opted_out = "---\nstructured_output: false\n" + text[len("---\n") :]
    files = {"summary.rllm": opted_out}
    result, _ = await run_app(client, rllm_settings, "summary.rllm", files, TEXT)
    assert result.output == {"summary": "Workflows survive crashes.", "sentences": 1}
    (req,) = llm.chat_requests
    assert req.json["response_format"] == {"type": "json_object"}
    (stats,) = get_stats(stats_db(rllm_settings), "summary")
    assert (stats.runs, stats.successes, stats.failures) == (1, 1, 0)
    assert (stats.input_compliance_pct, stats.output_compliance_pct) == (100.0, 100.0)
    assert (stats.avg_prompt_tokens, stats.avg_completion_tokens) == (5, 3)


async def test_input_as_json_and_yaml_text(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    files = bundle_files(EXAMPLES / "summary.rllm")
    r1, _ = await run_app(
        client, rllm_settings, "summary.rllm", files, json.dumps({"text": TEXT, "max_sentences": 4})
    )
    r2, _ = await run_app(
        client, rllm_settings, "summary.rllm", files, f"text: {TEXT}\nmax_sentences: 3\n"
    )
    assert r1.output == r2.output
    prompts = [user_prompt(r) for r in llm.chat_requests]
    assert "at most 4 sentences" in prompts[0] and "at most 3 sentences" in prompts[1]


# -- recovery ------------------------------------------------------------------------------


async def test_malformed_answer_recovered_on_retry(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    bad = '{"summary": "Workflows survive crashes."}'
    llm.enqueue(
        ScriptedReply(content=bad, prompt_tokens=40, completion_tokens=9),
        ScriptedReply(content=SUMMARY_OK, prompt_tokens=70, completion_tokens=12),
    )
    files = bundle_files(EXAMPLES / "summary.rllm")
    result, handle = await run_app(client, rllm_settings, "summary.rllm", files, {"text": TEXT})

    assert result.output["sentences"] == 1
    assert [a.ok for a in result.attempts] == [False, True] and result.retries == 1
    assert result.attempts[0].raw == bad
    assert result.attempts[0].errors == ["$.sentences: required property is missing"]
    assert result.usage.prompt_tokens == 110 and result.usage.completion_tokens == 21

    # The recovery prompt carries the exact validation error and the bad answer verbatim.
    first, second = llm.chat_requests
    recovery = user_prompt(second)
    assert "Your last reply was not valid:\n" + bad in recovery
    assert "- $.sentences: required property is missing" in recovery
    assert user_prompt(first) != recovery
    # Each attempt is its own activity in the history.
    assert await activity_names(handle) == [
        "rllm.load",
        "rllm.generate",
        "rllm.generate",
        "rllm.record_stats",
    ]
    (stats,) = get_stats(stats_db(rllm_settings), "summary")
    assert stats.avg_retries == 1 and stats.tokens_per_attempt == (49 + 82) / 2


async def test_default_recovery_template_used_without_a_recovery_section(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    llm.enqueue(ScriptedReply(content="I think the answer is yes."))
    llm.enqueue(ScriptedReply(content='{"answer": "yes"}'))
    files = {"probe.rllm": app_text()}
    result, _ = await run_app(client, rllm_settings, "probe.rllm", files, "cats")
    assert result.output == {"answer": "yes"}
    recovery = user_prompt(llm.chat_requests[1])
    assert recovery.startswith("Answer about cats.\n")
    assert "It was:\nI think the answer is yes." in recovery
    assert "- $: no JSON object found: the answer contains no '{'" in recovery
    assert '"required": [\n    "answer"\n  ]' in recovery  # the schema, indented


TICKET_INPUT = {
    "text": "My parcel never came.",
    "customer": {"name": "Ada", "email": "ada@example.org", "address": {"city": "Lyon"}},
}


async def test_pydantic_schema_app_recovers_a_bad_answer_naming_the_paths(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    """Schemas straight from model_json_schema(): $defs, optional anyOf-null, enums."""
    bad = json.dumps(
        {
            "priority": "urgent",
            "summary": "Parcel lost",
            "actions": [{"kind": "refund", "amount": 12.5}, {"kind": "call"}],
            "follow_up": {"city": 7},
        }
    )
    good = json.dumps(
        {"priority": "high", "summary": "Parcel lost", "actions": [{"kind": "refund"}]}
    )
    llm.enqueue(ScriptedReply(content=bad), ScriptedReply(content=good))
    files = {"ticket.rllm": ticket_app()}
    result, _ = await run_app(client, rllm_settings, "ticket.rllm", files, TICKET_INPUT)

    assert TicketOut.model_validate(result.output).priority == "high"
    assert [a.ok for a in result.attempts] == [False, True]
    expected = [
        '$.actions[1].kind: must be one of ["refund", "reply", "escalate"], got "call"',
        "$.follow_up.city: expected string, got integer 7",
        '$.priority: must be one of ["low", "high"], got "urgent"',
    ]
    assert result.attempts[0].errors == expected
    recovery = user_prompt(llm.chat_requests[1])
    for line in expected:
        assert f"- {line}" in recovery
    assert '"$defs"' in recovery  # the model sees the schema as written, references and all
    assert "Triage: My parcel never came." in user_prompt(llm.chat_requests[0])


async def test_pydantic_schema_app_refuses_bad_nested_input(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    bad_input = {**TICKET_INPUT, "customer": {"name": "Ada", "email": "ada@example.org"}}
    cause, payload, _ = await failure(
        client, rllm_settings, "ticket.rllm", {"ticket.rllm": ticket_app()}, bad_input
    )
    assert cause.type == "InputSchemaError"
    assert payload["details"]["issues"] == [
        {"path": "$.customer.address", "message": "required property is missing"}
    ]
    assert payload["expected_schema"] == {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **TicketIn.model_json_schema(),
    }
    assert llm.chat_requests == []


async def test_retry_exhaustion_lists_every_attempt(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    answers = ['{"summary": ""}', "no json", '{"summary": "x", "sentences": 0}']
    for i, a in enumerate(answers):
        llm.enqueue(ScriptedReply(content=a, prompt_tokens=10 + i, completion_tokens=4 + i))
    files = bundle_files(EXAMPLES / "summary.rllm")
    cause, payload, handle = await failure(
        client, rllm_settings, "summary.rllm", files, {"text": TEXT}
    )

    assert cause.type == "RetryExhaustedError" and cause.non_retryable
    err = error_from_payload(payload)
    assert isinstance(err, RetryExhaustedError) and EXIT_CODES[type(err)] == 16
    assert payload["error_code"] == "RLLM_RETRY_EXHAUSTED"
    attempts = payload["details"]["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["output"] for a in attempts] == answers
    assert [a["usage"]["prompt_tokens"] for a in attempts] == [10, 11, 12]
    assert [a["usage"]["completion_tokens"] for a in attempts] == [4, 5, 6]
    assert all(a["issues"] for a in attempts)
    assert attempts[2]["issues"][0]["path"] == "$.sentences"
    assert payload["details"]["usage"]["total_tokens"] == 10 + 11 + 12 + 4 + 5 + 6
    assert payload["expected_schema"]["required"] == ["summary", "sentences"]
    assert payload["received_payload"] == answers[-1]
    assert len(llm.chat_requests) == 3
    assert (await activity_names(handle)).count("rllm.generate") == 3

    (row,) = list_runs(stats_db(rllm_settings), "summary")
    assert (row.status, row.error_type, row.output_valid) == ("error", "RetryExhaustedError", False)
    assert (row.attempts, row.retries, row.max_completion_tokens) == (3, 2, 6)


async def test_max_retries_zero_fails_after_one_call(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    llm.enqueue(ScriptedReply(content="nope"))
    cause, payload, _ = await failure(
        client, rllm_settings, "probe.rllm", {"probe.rllm": app_text()}, "x", max_retries=0
    )
    assert cause.type == "RetryExhaustedError"
    assert len(payload["details"]["attempts"]) == 1 and len(llm.chat_requests) == 1


# -- refused before any call ---------------------------------------------------------------


async def test_input_schema_error(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    files = bundle_files(EXAMPLES / "summary.rllm")
    cause, payload, _ = await failure(
        client, rllm_settings, "summary.rllm", files, {"text": TEXT, "max_sentences": 9}
    )
    assert cause.type == "InputSchemaError"
    assert isinstance(error_from_payload(payload), InputSchemaError)
    assert payload["details"]["issues"][0]["path"] == "$.max_sentences"
    assert payload["received_payload"] == {"text": TEXT, "max_sentences": 9}
    assert llm.chat_requests == []
    (row,) = list_runs(stats_db(rllm_settings), "summary")
    assert (row.status, row.input_valid, row.attempts) == ("error", False, 0)


async def test_context_window_exceeded(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    files = {"probe.rllm": app_text(window=300, llm_params={"max_tokens": 100})}
    cause, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "word " * 400)
    assert cause.type == "ContextWindowExceededError"
    assert isinstance(error_from_payload(payload), ContextWindowExceededError)
    d = payload["details"]
    assert d["max_context_window"] == 300 and d["max_tokens"] == 100
    assert d["needed_tokens"] > 300
    assert llm.chat_requests == []


async def test_llm_params_checked_against_litellm(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    # top_k is in the format's allowlist, but LiteLLM's OpenAI provider does not take it.
    files = {"probe.rllm": app_text(llm_params={"max_tokens": 50, "top_k": 5})}
    cause, payload, handle = await failure(client, rllm_settings, "probe.rllm", files, "x")
    assert cause.type == "LLMParamValidationError"
    assert isinstance(error_from_payload(payload), LLMParamValidationError)
    d = payload["details"]
    assert d["param"] == "top_k" and d["litellm_model"] == "openai/scripted"
    assert "top_k" not in d["supported"] and "temperature" in d["supported"]
    assert "top_k" not in payload["expected_schema"]["properties"]
    assert llm.chat_requests == []
    assert await activity_names(handle) == ["rllm.load"]  # nothing loaded: no stats row


async def test_unknown_model_override(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    files = {"probe.rllm": app_text()}
    cause, payload, _ = await failure(
        client, rllm_settings, "probe.rllm", files, "x", model="gpt-99"
    )
    assert cause.type == "MetadataValidationError"
    assert payload["details"]["known"] == ["local"]


async def test_parse_error_from_bundle(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    cause, payload, _ = await failure(
        client, rllm_settings, "bad.rllm", {"bad.rllm": "no frontmatter\n"}, "x"
    )
    assert cause.type == "ParseError" and payload["error_code"] == "RLLM_PARSE_ERROR"


# -- composition ---------------------------------------------------------------------------


def scripted_by_prompt(req: RecordedRequest) -> ScriptedReply:
    """Children run in parallel, so answers go by what the prompt asks, not by order."""
    prompt = user_prompt(req)
    if "keywords" in prompt:
        return ScriptedReply(
            content='{"keywords": ["Temporal", "workers", "temporal", "workflow"]}',
            prompt_tokens=30,
            completion_tokens=11,
        )
    return ScriptedReply(content=SUMMARY_OK, prompt_tokens=20, completion_tokens=7)


async def test_composition_of_two_children(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    llm.default = scripted_by_prompt
    files = bundle_files(EXAMPLES / "compose_summary_keywords.rllm")
    assert sorted(files) == [
        "compose_summary_keywords.rllm",
        "extract_keywords.rllm",
        "summary.rllm",
    ]
    result, handle = await run_app(
        client, rllm_settings, "compose_summary_keywords.rllm", files, {"text": TEXT}
    )

    # The merged, typed output: summary from one child, keywords from the other, after
    # extract_keywords' post block dropped the repeated "temporal".
    assert result.output == {
        "summary": "Workflows survive crashes.",
        "keywords": ["Temporal", "workers", "workflow"],
    }
    assert result.attempts == [] and set(result.children) == {"summarised", "keywords_of"}
    kw = result.children["keywords_of"]
    assert kw.output["keywords"] == ["Temporal", "workers", "workflow"]
    assert result.usage.prompt_tokens == 50 and result.usage.completion_tokens == 18
    # extract_keywords' pre block squashed the whitespace before rendering.
    kw_prompt = next(user_prompt(r) for r in llm.chat_requests if "keywords" in user_prompt(r))
    assert "Text:\n" + " ".join(TEXT.split()) in kw_prompt

    # The parent made no model call; the children are child workflows with derived ids.
    assert await activity_names(handle) == ["rllm.load", "rllm.record_stats"]
    wid = handle.id
    child = client.get_workflow_handle(f"{wid}/keywords_of")
    assert await activity_names(child) == [
        "rllm.load",
        "rllm.block",
        "rllm.generate",
        "rllm.block",
        "rllm.record_stats",
    ]
    sessions = stats_db(rllm_settings)
    for app in ("compose_summary_keywords", "summary", "extract_keywords"):
        (s,) = get_stats(sessions, app, "local")
        assert s.successes == 1, app


async def test_chained_children_and_child_failure_payload(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    """A child reads an earlier child's output; a grandchild's failure names its path."""
    child = app_text("child", prompt="Echo {{ text }}.\n")
    parent = app_text(
        "parent",
        prompt="Combine {{ first.answer }} and {{ second.answer }}.\n",
        extra=(
            "uses:\n"
            "  - {path: lib/child.rllm, alias: first, exposes: [answer], "
            "input_map: {text: text}}\n"
            "  - {path: lib/child.rllm, alias: second, exposes: [answer], "
            "input_map: {text: first.answer}}\n"
        ),
    )
    files = {"parent.rllm": parent, "lib/child.rllm": child}
    llm.enqueue(
        ScriptedReply(content='{"answer": "one"}'),
        ScriptedReply(content='{"answer": "two"}'),
        ScriptedReply(content='{"answer": "both"}'),
    )
    result, _ = await run_app(client, rllm_settings, "parent.rllm", files, "start")
    assert result.output == {"answer": "both"}
    prompts = [user_prompt(r) for r in llm.chat_requests]
    assert prompts == ["Echo start.\n", "Echo one.\n", "Combine one and two.\n"]

    # Now the first child never answers validly.
    llm.enqueue(*[ScriptedReply(content="no") for _ in range(3)])
    cause, payload, _ = await failure(client, rllm_settings, "parent.rllm", files, "start")
    assert cause.type == "RetryExhaustedError"
    assert payload["details"]["child"] == "first"


async def test_cycle_detected_through_the_workflow(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    use_b = "uses:\n  - {path: b.rllm, alias: b, exposes: [answer], input_map: {text: text}}\n"
    use_a = "uses:\n  - {path: a.rllm, alias: a, exposes: [answer], input_map: {text: text}}\n"
    files = {"a.rllm": app_text("a", extra=use_b), "b.rllm": app_text("b", extra=use_a)}
    cause, payload, _ = await failure(client, rllm_settings, "a.rllm", files, "x")
    assert cause.type == "DependencyResolutionError"
    assert isinstance(error_from_payload(payload), DependencyResolutionError)
    assert payload["details"]["cycle"] == ["a.rllm", "b.rllm", "a.rllm"]
    assert "a.rllm -> b.rllm -> a.rllm" in payload["message"]
    assert llm.chat_requests == []


async def test_missing_child_in_bundle(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    use = "uses:\n  - {path: gone.rllm, alias: g, exposes: [answer], input_map: {text: text}}\n"
    files = {"a.rllm": app_text("a", extra=use)}
    cause, payload, _ = await failure(client, rllm_settings, "a.rllm", files, "x")
    assert cause.type == "DependencyResolutionError"
    assert payload["details"]["cause"]["error_code"] == "RLLM_PARSE_ERROR"


async def test_app_from_the_workers_disk(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    result, _ = await run_app(client, rllm_settings, str(EXAMPLES / "summary.rllm"), {}, TEXT)
    assert result.output["sentences"] == 1


# -- Python blocks in the sandbox ----------------------------------------------------------

PROBE_OUT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["answer"],
    "properties": {
        "answer": {"type": "string"},
        "probes": {"type": "array", "items": {"type": "string"}},
    },
}


def block_app(code: str, stage: str = "pre") -> dict[str, str]:
    if stage == "pre":
        header = "=== python name=probe stage=pre inputs=text outputs=text ===\n"
    else:
        header = "=== python name=probe stage=post inputs=answer outputs=probes ===\n"
    return {
        "probe.rllm": app_text(
            output_schema=PROBE_OUT,
            prompt="Answer about {{ text }}.\n",
            sections=header + textwrap.dedent(code),
        )
    }


async def test_block_timeout_fails_the_run(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    files = block_app("while True:\n    pass\ntext = text\n")
    cause, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "x")
    assert cause.type == "PythonBlockExecutionError"
    assert isinstance(error_from_payload(payload), PythonBlockExecutionError)
    d = payload["details"]
    assert (d["block"], d["stage"], d["type"]) == ("probe", "pre", "Timeout")
    assert "2 s CPU" in d["message"]
    assert payload["received_payload"] == {"text": "x"}
    assert llm.chat_requests == []


async def test_block_memory_limit(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    files = block_app("big = bytearray(1024 * 1024 * 1024)\ntext = text\n")
    cause, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "x")
    assert cause.type == "PythonBlockExecutionError"
    assert payload["details"]["type"] == "MemoryError"


async def test_block_forging_a_deep_result_is_a_block_error(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    """A result file nested 100,000 deep is the block's failure, not a host RecursionError."""
    files = block_app(
        "import os\n"
        "with open('/work/.keel_block_result.json', 'w') as f:\n"
        "    f.write('{\"ok\": true, \"outputs\": {\"text\": ' + '[' * 100000 + ']' * 100000 + '}}')\n"
        "os._exit(0)\n"
    )
    cause, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "x")
    assert cause.type == "PythonBlockExecutionError"
    assert payload["details"]["type"] == "InvalidResult"
    assert "deeper than" in payload["details"]["message"]
    assert llm.chat_requests == []


async def test_block_exception_reported_with_traceback(
    client: Client, rllm_settings: Settings, rllm_worker: Worker
) -> None:
    files = block_app("text = text.upper()\nraise ValueError('bad input ' + text)\n")
    _, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "x")
    d = payload["details"]
    assert (d["type"], d["message"]) == ("ValueError", "bad input X")
    assert "ValueError" in d["traceback"]


async def test_block_has_no_network_and_cannot_write_outside_its_workspace(
    client: Client, rllm_settings: Settings, rllm_worker: Worker, llm: ScriptedOpenAIServer
) -> None:
    # The scripted model server listens on the host's loopback: the block must not reach it.
    # Host paths: one the jail does not see at all (this tests directory), one it sees
    # read-only (the venv, bound for the interpreter), and /tmp, which in the jail is its
    # own small tmpfs: writable there, never the host's.
    unseen = Path(__file__).resolve().parent / f"keel-rllm-marker-{uuid.uuid4().hex}"
    tmp_marker = Path(tempfile.gettempdir()) / f"keel-rllm-marker-{uuid.uuid4().hex}"
    code = f"""
    import socket, sys
    probes = []
    try:
        socket.create_connection(("127.0.0.1", {llm.port}), timeout=2).close()
        probes.append("net:connected")
    except OSError as e:
        probes.append("net:refused")
    for p in ["/usr/x", "/etc/x", "/keel/x", "/x", {str(unseen)!r}, sys.prefix + "/x"]:
        try:
            with open(p, "w") as f:
                f.write("x")
            probes.append("wrote:" + p)
        except OSError:
            probes.append("refused:" + p)
    with open({str(tmp_marker)!r}, "w") as f:
        f.write("jail tmp")
    with open("/work/scratch", "w") as f:
        f.write("ok")
    probes.append("workspace:" + open("/work/scratch").read())
    """
    llm.default = ScriptedReply(content='{"answer": "a"}')
    result, handle = await run_app(
        client, rllm_settings, "probe.rllm", block_app(code, "post"), "x"
    )
    probes = result.output["probes"]
    assert probes[0] == "net:refused"
    assert not [p for p in probes if p.startswith("wrote:")], probes
    assert len([p for p in probes if p.startswith("refused:")]) == 6, probes
    assert probes[-1] == "workspace:ok"
    assert not unseen.exists() and not tmp_marker.exists()
    assert len(llm.chat_requests) == 1  # only the model call reached the server
    assert "rllm.block" in await activity_names(handle)


async def test_block_fails_closed_when_the_sandbox_cannot_start(
    client: Client, rllm_settings: Settings, llm: ScriptedOpenAIServer, sandbox_base: Path
) -> None:
    marker = sandbox_base / "ran"
    broken = SandboxConfig(
        nsjail_path=str(sandbox_base / "no-such-nsjail"),
        jail=JailSettings(base_dir=str(sandbox_base)),
    )
    files = block_app(f"open({str(marker)!r}, 'w').write('x')\ntext = text\n")
    async with make_worker(client, rllm_settings, sandbox_config=broken):
        cause, payload, _ = await failure(client, rllm_settings, "probe.rllm", files, "x")
    assert cause.type == "PythonBlockExecutionError"
    assert payload["details"]["type"] == "SandboxUnavailable"
    assert "sandbox cannot start" in payload["message"]
    assert not marker.exists()
    assert llm.chat_requests == []
