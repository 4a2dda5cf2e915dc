"""The Keel worker: every workflow and activity on task queue ``keel``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.langgraph import LangGraphPlugin
from temporalio.worker import Plugin, Worker

from activities.actors import ActorPool
from activities.design import DesignActivities
from activities.llm import LLMGateway, sql_recorder
from activities.mrp import MrpActivities
from activities.notify import NotifyActivities
from activities.ollama import OllamaActivities
from activities.records import RecordActivities
from activities.rllm import RllmActivities
from activities.srl.episode import SrlActivities
from keel.search_attributes import SEARCH_ATTRIBUTES
from keel.settings import Settings
from sandbox.models import config_for
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.files import load_actors_config, load_models_config
from workflows.demo import KeelDemo
from workflows.design import GRAPH_NAME, DesignPipeline, build_graph
from workflows.gate import ApprovalGate
from workflows.mrp import MRPJob
from workflows.rllm import RllmApp
from workflows.srl import SRLCollection, SRLEpisode

log = logging.getLogger(__name__)

WORKFLOWS: Sequence[type] = (
    ApprovalGate,
    KeelDemo,
    RllmApp,
    MRPJob,
    SRLCollection,
    SRLEpisode,
    DesignPipeline,
)


def plugins() -> list[Plugin]:
    """The worker's (and a replayer's) plugins: LangGraph, with the design graph.

    A fresh graph each call: the plugin rewrites the nodes of the graph it is given.
    """
    return [LangGraphPlugin(graphs={GRAPH_NAME: build_graph()})]


def build_activities(settings: Settings) -> list[Any]:
    """Activity callables bound to their real clients, built from settings."""
    sessions = get_sessionmaker(settings.resolved_database_url)

    notify = NotifyActivities(
        default_url=settings.webhook_url,
        secret=settings.webhook_secret.get_secret_value(),
        allowed_prefixes=settings.webhook_allowed_prefixes,
    )
    records = RecordActivities(sessions)
    models = load_models_config(settings.models_config)
    llm = LLMGateway(models, on_call=sql_recorder(sessions))
    sandbox_config = config_for(settings.sandbox_config, settings.nsjail_path)
    rllm = RllmActivities(llm, sessions, sandbox_config=sandbox_config)
    ollama = OllamaActivities(settings.ollama_base_url, models)
    mrp = MrpActivities(settings)
    srl = SrlActivities(
        sessions=sessions,
        artifacts=artifact_store_from_settings(settings),
        llm=llm,
        prompts_path=settings.srl_prompts,
        sandbox_config=sandbox_config,
        actors=lambda: ActorPool(load_actors_config(settings.srl_actors_config)),
    )
    design = DesignActivities(
        sessions=sessions,
        artifacts=artifact_store_from_settings(settings),
        llm=llm,
        config_dir=settings.design_config_dir,
        sandbox_config=sandbox_config,
        anthropic_api_key=settings.anthropic_api_key,
        anthropic_base_url=settings.anthropic_base_url,
        repos_dir=settings.design_repos_dir,
        policy_path=settings.design_policy_path,
    )
    return [
        notify.webhook,
        notify.has_target,
        records.gate_event,
        llm.complete,
        *rllm.all(),
        ollama.ensure,
        *mrp.all(),
        *srl.all(),
        *design.all(),
    ]


def build_worker(
    client: Client,
    settings: Settings,
    *,
    task_queue: str | None = None,
    max_cached_workflows: int = 1000,
    extra_workflows: Sequence[type] = (),
) -> Worker:
    """A worker for every Keel workflow and activity (and ``extra_workflows``: the benches
    run their floor workflows in the same worker process)."""
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=build_activities(settings),
        activity_executor=ThreadPoolExecutor(max_workers=8),
        max_cached_workflows=max_cached_workflows,
        plugins=plugins(),
    )


async def ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register Keel's search attributes on clusters that lack them (the dev server has them)."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {k: v for k, v in SEARCH_ATTRIBUTES.items() if k not in resp.custom_attributes}
    if not missing:
        return
    kinds = {
        "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
        "KeywordList": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST,
    }
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=namespace,
            search_attributes={k: kinds[v] for k, v in missing.items()},
        )
    )
    log.info("registered search attributes %s", sorted(missing))
