"""Keel's families, each listed once: what the worker, the CLIs, ``GET /runs``, the console
and ``keel migrate-search-attributes`` read about a family.

A family is one kind of durable work (gates, ``.rllm`` apps, MRP jobs, SRL collections,
design pipelines, the demo). Its entry names the workflow types of its runs (the top-level
ones, rows of ``GET /runs``) and of the children it starts, its CLI's exit-code table
(stable, documented per family: ``docs/mrp-cli.md``, ``docs/design-cli.md``, ...), how its
CLI writes an error, whether its runs answer :data:`keel.access.READERS_SIGNAL`, and how a
running run shows its progress. What the worker registers for a family (workflow classes,
activity callables) is its twin entry in ``workers/families.py``, which may import the
runtime; this module may not (``keel`` is pure), and stays cheap to import: every CLI's
``--help`` reads the exit codes through it (strings and ints, no pydantic).

Adding a family is one :class:`FamilySpec` here (:data:`BUILTIN`, or :func:`register` for a
family that lives outside Keel, as the tests' toy family does) plus one
``workers.families.WorkerFamily``; docs/architecture.md says where its own files go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Protocol, TypeVar

ErrorStyle = Literal["envelope", "payload"]

#: How a running run shows its progress in lists (``GET /runs``, the console): ``memo``:
#: the workflow keeps its progress memo (``keel.progress``) up to date at its step
#: boundaries, so a list reads it from the visibility row it already has (no query to any
#: worker); ``none``: a list shows no progress for it.
ProgressSource = Literal["memo", "none"]


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One family, as everything above the worker sees it."""

    #: The family's name: ``GET /runs``'s ``family``, the error envelope's ``family``.
    name: str
    #: How the console names one of its runs (``MRP job``).
    label: str
    #: The workflow types of its runs (top-level: started by a person, the API or a CLI).
    workflow_types: tuple[str, ...]
    #: Workflow types it starts only as children (never rows of ``GET /runs``).
    children: tuple[str, ...] = ()
    #: Its CLI's exit codes by error code (None: it has no CLI of its own).
    exit_codes: Mapping[str, int] | None = None
    #: How its CLI writes an error on stdout: ``envelope`` (``{"error": CliError}`` in JSON
    #: mode) or ``payload`` (the family's own document, always: ``runllm``).
    error_style: ErrorStyle = "envelope"
    #: Its runs are rows of ``GET /runs`` (gates are listed by ``GET /gates`` instead).
    listed_in_runs: bool = True
    #: Its running runs answer :data:`keel.access.READERS_SIGNAL` (they set ``KeelReaders``
    #: from their own access memo: ``keel migrate-search-attributes``).
    answers_readers: bool = False
    #: Where a list reads a running run's progress (:data:`ProgressSource`).
    progress: ProgressSource = "none"
    #: The query that answers one run's detailed progress (``mrp run``'s watch, ``srl
    #: status``), asked of one run at a time, never by a list. None: it has none.
    progress_query: str | None = None


# -- the built-in families --------------------------------------------------------------------
# The type names are the ones each family's models declare (keel/gates.py, keel/rllm/run.py,
# ...); they are repeated here as strings so that this module imports no models (every CLI
# reads its exit codes from here at start). tests/core/unit/test_families.py checks that
# both agree.

_GATE = FamilySpec(
    name="gate",
    label="approval gate",
    workflow_types=("ApprovalGate",),
    exit_codes={
        "ok": 0,
        "error": 1,  # unexpected error, Temporal or the worker unavailable
        "usage": 2,  # bad command line (click)
        "not_found": 3,  # no gate with that id
        "refused": 4,  # the gate refused the decision (self-approval, not an approver)
        "closed": 5,  # the gate is already decided or expired, or its run ended
    },
    listed_in_runs=False,
    answers_readers=True,
    progress_query="state",
)

_RLLM = FamilySpec(
    name="rllm",
    label=".rllm run",
    # A ``uses`` entry runs as a child of the same type.
    workflow_types=("RllmApp",),
    # runllm's 10-19 are the ten .rllm error classes' (keel.rllm.errors, fixed by the .rllm
    # spec; tests/core/unit/test_cli_toolkit.py checks that they agree).
    exit_codes={
        "ok": 0,
        "RLLM_INTERNAL_ERROR": 1,
        "RLLM_USAGE_ERROR": 2,
        "RLLM_PARSE_ERROR": 10,
        "RLLM_METADATA_INVALID": 11,
        "RLLM_LLM_PARAMS_INVALID": 12,
        "RLLM_INPUT_SCHEMA_MISMATCH": 13,
        "RLLM_OUTPUT_SCHEMA_MISMATCH": 14,
        "RLLM_CONTEXT_WINDOW_EXCEEDED": 15,
        "RLLM_RETRY_EXHAUSTED": 16,
        "RLLM_DEPENDENCY_UNRESOLVED": 17,
        "RLLM_PYTHON_BLOCK_FAILED": 18,
        "RLLM_OLLAMA_MODEL_MISSING": 19,
    },
    error_style="payload",
    answers_readers=True,
    progress="memo",
    progress_query="step",
)

_MRP = FamilySpec(
    name="mrp",
    label="MRP job",
    workflow_types=("MRPJob",),
    children=("ApprovalGate",),
    exit_codes={
        "ok": 0,
        "error": 1,  # unexpected error, Temporal or the worker unavailable
        "usage": 2,  # bad command line (click)
        "invalid_job": 3,  # the YAML is not a valid job (DSL error, with lines)
        "refused": 4,  # policy refused the job, or an operator was refused (pin, signature)
        "run_failed": 5,  # the run ended but did not succeed (failed, budget_exceeded, ...)
        "replay_mismatch": 6,  # a replay produced a different digest
        "not_found": 7,  # no run with that id
    },
    answers_readers=True,
    progress="memo",
    progress_query="progress",
)

_SRL = FamilySpec(
    name="srl",
    label="SRL collection",
    workflow_types=("SRLCollection",),
    children=("SRLEpisode",),
    exit_codes={
        "ok": 0,
        "error": 1,  # unexpected error, the sandbox unavailable
        "usage": 2,  # bad command line (click), an unknown dataset or language
        "download_impossible": 3,  # no --from: there is no network to download from
        "manifest_required": 4,  # the published hashes are unknown and no --manifest given
        "manifest_mismatch": 5,  # a file's size or sha256 differs from the manifest
        "not_found": 6,  # a file the manifest lists, an ingested dataset, a collection or steps
        "too_few_tasks": 7,  # srl synth verified fewer tasks than --min asks
        "invalid_input": 8,  # a task file that does not validate (its line named)
        "run_failed": 9,  # the collection failed
    },
    answers_readers=True,
    progress="memo",
    progress_query="progress",
)

_DESIGN = FamilySpec(
    name="design",
    label="design pipeline",
    workflow_types=("DesignPipeline",),
    children=("ApprovalGate",),
    exit_codes={
        "ok": 0,  # the decision set completed
        "error": 1,  # unexpected error, Temporal or the worker unavailable
        "usage": 2,  # bad command line (click), no requirements given
        "not_found": 3,  # no such project, decision set, open gate, diff or archive
        "invalid_input": 4,  # an unreadable file, an intake that is not the schema
        "refused": 5,  # an answer or a gate decision the workflow refused (its reason given)
        "conflict": 6,  # the project is another user's, the decision set exists
        "rejected": 7,  # the plan was rejected (no comment, or no rounds left)
        "not_covered": 8,  # the questions were not answered into coverage
        "expired": 9,  # the gate expired undecided
        "run_failed": 10,  # the pipeline failed or was terminated (run-error)
        "validation_failed": 11,  # the generated repository failed a validator
    },
    progress="memo",
    progress_query="status",
)

#: ``keel demo``'s workflow: top-level, but a walkthrough rather than work someone lists;
#: its CLI is ``keel`` (whose exit codes are the toolkit's own, not a family's).
_DEMO = FamilySpec(
    name="demo",
    label="Keel demo",
    workflow_types=("KeelDemo",),
    children=("ApprovalGate",),
    listed_in_runs=False,
)

#: Keel's own families, in the order the worker registers them and lists show them.
BUILTIN: tuple[FamilySpec, ...] = (_GATE, _DEMO, _RLLM, _MRP, _SRL, _DESIGN)

_families: dict[str, FamilySpec] = {f.name: f for f in BUILTIN}

#: Every registered family by name (read-only; :func:`register` adds one).
FAMILIES: Mapping[str, FamilySpec] = MappingProxyType(_families)


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family. Its name and its top-level workflow types must be new: a type is a
    run of exactly one family."""
    if spec.name in _families:
        raise ValueError(f"a family named {spec.name!r} is registered already")
    if not spec.workflow_types:
        raise ValueError(f"family {spec.name!r} names no workflow type")
    taken = {t: f.name for f in _families.values() for t in f.workflow_types}
    for t in spec.workflow_types:
        if t in taken:
            raise ValueError(f"workflow type {t!r} is family {taken[t]!r}'s already")
    _families[spec.name] = spec
    return spec


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_N = TypeVar("_N", bound=_Named)


def drop_added(registered: dict[str, _N], builtin: Iterable[_N], name: str) -> None:
    """Remove ``name`` from ``registered`` if a ``register`` added it; a built-in family
    stays (``ValueError``). Both family registries, this one and the worker's
    (``workers/families.py``), unregister by this rule."""
    if any(f.name == name for f in builtin):
        raise ValueError(f"{name!r} is a built-in family")
    registered.pop(name, None)


def unregister(name: str) -> None:
    """Remove a family :func:`register` added (the built-in ones stay)."""
    drop_added(_families, BUILTIN, name)


def families() -> Iterator[FamilySpec]:
    """Every registered family, built-in ones first."""
    return iter(tuple(_families.values()))


def family_of_type(workflow_type: str) -> FamilySpec | None:
    """The family whose run ``workflow_type`` is (None: a child type, or none of Keel's)."""
    for f in _families.values():
        if workflow_type in f.workflow_types:
            return f
    return None


def run_families() -> list[FamilySpec]:
    """The families whose runs ``GET /runs`` lists."""
    return [f for f in _families.values() if f.listed_in_runs]


def reader_types() -> tuple[str, ...]:
    """The workflow types whose runs answer :data:`keel.access.READERS_SIGNAL`."""
    return tuple(t for f in _families.values() if f.answers_readers for t in f.workflow_types)


def exit_codes() -> dict[str, Mapping[str, int]]:
    """Each family's CLI exit codes, by family name (families without a CLI left out)."""
    return {f.name: f.exit_codes for f in _families.values() if f.exit_codes is not None}


def error_styles() -> dict[str, ErrorStyle]:
    """How each family's CLI writes an error, by family name (those with a CLI)."""
    return {f.name: f.error_style for f in _families.values() if f.exit_codes is not None}
