"""What the worker registers for each family: its workflow classes, its activity callables
(bound to their real clients), its worker plugins.

The twin of :mod:`keel.families`, which says what everything above the worker reads about
a family (its workflow types, exit codes, progress); this half imports the runtime
(workflows, activities, the store), which only the worker may. ``workers/main.py`` builds
its worker from :func:`worker_families`, so a family registered here (one
:class:`WorkerFamily`, plus its :class:`keel.families.FamilySpec`) runs on every worker
Keel starts; nothing else lists workflow classes or activities.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from activities.actors import ActorPool
from activities.design import DesignActivities
from activities.design.repair import RepairActivities
from activities.llm import LLMGateway, sql_recorder
from activities.mrp import MrpActivities
from activities.notify import NotifyActivities
from activities.ollama import OllamaActivities
from activities.records import RecordActivities
from activities.rllm import RllmActivities
from activities.srl.episode import SrlActivities
from keel.families import FAMILIES, drop_added
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

if TYPE_CHECKING:
    from temporalio.worker import Plugin


class WorkerDeps:
    """The clients activities share, built from settings once per worker, on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def sessions(self) -> Any:
        return get_sessionmaker(self.settings.resolved_database_url)

    @cached_property
    def models(self) -> Any:
        return load_models_config(self.settings.models_config)

    @cached_property
    def llm(self) -> LLMGateway:
        """The LLM gateway, every call recorded in SQL (``llm.complete`` and the families')."""
        return LLMGateway(self.models, on_call=sql_recorder(self.sessions))

    @cached_property
    def sandbox_config(self) -> Any:
        return config_for(self.settings.sandbox_config, self.settings.nsjail_path)

    def artifacts(self) -> Any:
        """An artifact store (a fresh client each call, as each family had its own)."""
        return artifact_store_from_settings(self.settings)


Activities = Callable[[WorkerDeps], Sequence[Any]]


def _none(_: WorkerDeps) -> Sequence[Any]:
    return ()


@dataclass(frozen=True)
class WorkerFamily:
    """What a worker registers for the family :data:`keel.families.FAMILIES` names ``name``."""

    name: str
    #: Every workflow class of the family: its runs' and its children's.
    workflows: Sequence[type]
    #: Its activity callables, bound to the worker's clients.
    activities: Activities = _none
    #: Worker plugins it needs (a fresh list each call).
    plugins: Callable[[], list[Plugin]] = field(default=list)


# -- Keel's families ----------------------------------------------------------------------------


def _shared(deps: WorkerDeps) -> Sequence[Any]:
    """The activities any family's workflow may call (``keel.refs``): the LLM gateway."""
    return [deps.llm.complete]


def _gate(deps: WorkerDeps) -> Sequence[Any]:
    s = deps.settings
    notify = NotifyActivities(
        default_url=s.webhook_url,
        secret=s.webhook_secret.get_secret_value(),
        allowed_prefixes=s.webhook_allowed_prefixes,
    )
    records = RecordActivities(deps.sessions)
    return [notify.webhook, notify.has_target, records.gate_event]


def _rllm(deps: WorkerDeps) -> Sequence[Any]:
    rllm = RllmActivities(deps.llm, deps.sessions, sandbox_config=deps.sandbox_config)
    ollama = OllamaActivities(deps.settings.ollama_base_url, deps.models)
    return [*rllm.all(), ollama.ensure]


def _mrp(deps: WorkerDeps) -> Sequence[Any]:
    return MrpActivities(deps.settings).all()


def _srl(deps: WorkerDeps) -> Sequence[Any]:
    s = deps.settings
    srl = SrlActivities(
        sessions=deps.sessions,
        artifacts=deps.artifacts(),
        llm=deps.llm,
        prompts_path=s.srl_prompts,
        sandbox_config=deps.sandbox_config,
        actors=lambda: ActorPool(load_actors_config(s.srl_actors_config)),
    )
    return srl.all()


def _design(deps: WorkerDeps) -> Sequence[Any]:
    s = deps.settings
    design = DesignActivities(
        sessions=deps.sessions,
        artifacts=deps.artifacts(),
        llm=deps.llm,
        config_dir=s.design_config_dir,
        sandbox_config=deps.sandbox_config,
        anthropic_api_key=s.anthropic_api_key,
        anthropic_base_url=s.anthropic_base_url,
        repos_dir=s.design_repos_dir,
        policy_path=s.design_policy_path,
    )
    repair = RepairActivities(artifacts=deps.artifacts(), llm=deps.llm)
    return [*design.all(), repair.repair]


def _design_plugins() -> list[Plugin]:
    """LangGraph, with the design graph (a fresh graph each call: the plugin rewrites the
    nodes of the graph it is given)."""
    from temporalio.langgraph import LangGraphPlugin

    return [LangGraphPlugin(graphs={GRAPH_NAME: build_graph()})]


#: Activities that belong to no one family (registered on every worker).
SHARED = WorkerFamily(name="shared", workflows=(), activities=_shared)

BUILTIN: tuple[WorkerFamily, ...] = (
    WorkerFamily("gate", (ApprovalGate,), _gate),
    WorkerFamily("demo", (KeelDemo,)),
    WorkerFamily("rllm", (RllmApp,), _rllm),
    WorkerFamily("mrp", (MRPJob,), _mrp),
    WorkerFamily("srl", (SRLCollection, SRLEpisode), _srl),
    WorkerFamily("design", (DesignPipeline,), _design, plugins=_design_plugins),
)

_families: dict[str, WorkerFamily] = {f.name: f for f in BUILTIN}


def register(family: WorkerFamily) -> WorkerFamily:
    """Add what the worker registers for a family (its ``keel.families`` entry first)."""
    if family.name not in FAMILIES:
        raise ValueError(f"register family {family.name!r} in keel.families first")
    if family.name in _families:
        raise ValueError(f"the worker registers family {family.name!r} already")
    _families[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a family :func:`register` added (the built-in ones stay)."""
    drop_added(_families, BUILTIN, name)


def worker_families() -> Iterator[WorkerFamily]:
    """Every family the worker registers, built-in ones first."""
    return iter(tuple(_families.values()))


def workflow_classes() -> list[type]:
    """Every registered family's workflow classes."""
    return [w for f in worker_families() for w in f.workflows]


def activity_callables(settings: Settings) -> list[Any]:
    """Every registered family's activities (and the shared ones), bound to clients built
    from ``settings``."""
    deps = WorkerDeps(settings)
    return [a for f in (SHARED, *worker_families()) for a in f.activities(deps)]


def worker_plugins() -> list[Plugin]:
    """Every registered family's worker plugins (fresh ones each call)."""
    return [p for f in worker_families() for p in f.plugins()]
