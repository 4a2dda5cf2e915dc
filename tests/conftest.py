"""Fixtures every family shares: one real Temporal dev server per test session, a fresh
task queue per test, the API in process, an empty SQL database (SQLite, and PostgreSQL
when ``KEEL_TEST_POSTGRES_URL`` is set). A family's own fixtures are in its conftest.py.

Set ``KEEL_TEST_TEMPORAL_ADDRESS`` to run against an existing server instead.

Parallel runs (``scripts/test.sh`` runs ``pytest -n 2 --dist loadgroup``): each
pytest-xdist worker is its own session, with its own Temporal dev server, embedded
model server, temp dirs and free ports; PostgreSQL is shared, one schema per test. A
test file runs whole on one worker (its module fixtures are set up once), and every test
that uses the embedded model runs on the same worker (see ``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from temporalio.worker import Worker

from activities.srl.data import uninterrupted
from api.app import create_app
from client.temporal import connect
from keel.settings import Settings
from services.model_server import LocalModelServer, unavailable_reason
from services.processes import TemporalDevServer, free_port
from store.db import dispose_engines, get_sessionmaker
from tests.support.api import asgi_client, with_tokens
from workers.main import build_worker

# tests.support.skips: a skip, xfail or xpass that tests/skip_allowlist.toml does not
# allow fails the run.
pytest_plugins = ["tests.support.faults", "tests.support.skips"]

# CPython before 3.13 keeps ``ast.parse``'s recursion count in interpreter-wide state
# (cpython gh-106905): a parse interrupted by another raises SystemError "AST constructor
# recursion depth mismatch". Here pytest rewrites a module imported late in a worker's
# thread (anyio's, httpx's) while another thread parses, or a finalizer run by the
# garbage collector inside a parse formats a traceback (which parses): CI failed on it
# in test_keel_pure, importing anthropic, and in test_parse_threads. In the test process
# every parse goes the way Keel's own do (activities/srl/data.py).
if sys.version_info < (3, 13):
    _ast_parse = ast.parse

    def _one_parse_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with uninterrupted():
            return _ast_parse(*args, **kwargs)

    ast.parse = _one_parse_at_a_time  # type: ignore[assignment]


POSTGRES_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "")

# The suite starts dozens of short-lived `keel worker` processes (fault tests, `keel up`,
# the CLIs), most of which never call a model: they load LiteLLM and the IRI grammar at
# their first use instead of at start (about 6 s of CPU each). The README's first command
# runs with the default (tests/core/integration/test_cli.py::test_demo_end_to_end).
os.environ.setdefault("KEEL_WORKER_PRELOAD", "false")

#: The test files that run the embedded llama.cpp model (the ``local_model_server``
#: fixture, ``keel demo``, or a ``LocalModelServer`` of their own, marked
#: ``@pytest.mark.embedded_model``). Under xdist they all run on one worker: the model
#: answers one request at a time and takes both cores while it does, so two at once only
#: make each slower and their timeouts nearer. Collection fails if a test that uses the
#: model is in a file not listed here.
EMBEDDED_MODEL_FILES = frozenset(
    {
        "tests/console/test_design_console_free_text.py",
        "tests/core/integration/test_cli.py",
        "tests/core/integration/test_local_model.py",
        "tests/design/integration/test_agents.py",
        "tests/design/integration/test_intake_paragraph.py",
        "tests/mrp/integration/test_examples.py",
        "tests/rllm/integration/test_cli.py",
        "tests/rllm/integration/test_local_model.py",
        "tests/srl/integration/test_actor_collection.py",
        "tests/srl/integration/test_actor_pool.py",
    }
)
EMBEDDED_MODEL_GROUP = "embedded-model"


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def xdist_scope(nodeid: str) -> str:
    """The work unit of a test under ``--dist loadgroup``: its file, or the embedded
    model's group. (pytest-xdist 3.8 cannot read ``xdist_group`` marks under pytest 9,
    whose node ids it can no longer suffix, so the grouping is by node id, here.)"""
    file = _file(nodeid)
    return EMBEDDED_MODEL_GROUP if file in EMBEDDED_MODEL_FILES else file


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: whole files (and the embedded model's group) as work units,
    handed out in collection order (see ``pytest_collection_modifyitems``)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    config.option.loadscopereorder = False
    return FileScheduling(config, log)


#: Seconds each test file took in a measured run (tests/support/durations.py writes it).
DURATIONS_FILE = Path(__file__).with_name("durations.json")


def scope_seconds(scopes: set[str]) -> dict[str, float]:
    """Each work unit's expected seconds: its file's from tests/durations.json (the
    embedded model's group: the sum of its files'); a file not there, the median."""
    table: dict[str, float] = json.loads(DURATIONS_FILE.read_text())
    median = sorted(table.values())[len(table) // 2] if table else 1.0
    seconds = {scope: table.get(scope, median) for scope in scopes}
    if EMBEDDED_MODEL_GROUP in scopes:
        seconds[EMBEDDED_MODEL_GROUP] = sum(table.get(f, median) for f in EMBEDDED_MODEL_FILES)
    return seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check that every embedded-model test is in a listed file; on an xdist worker (where
    collection happens), order the work units longest first by tests/durations.json
    (each file whole and in its own order), so the short files fill in at the end instead
    of one long file starting last and running alone."""
    for item in items:
        uses_model = item.get_closest_marker("embedded_model") is not None or (
            "local_model_server" in getattr(item, "fixturenames", ())
        )
        if uses_model and _file(item.nodeid) not in EMBEDDED_MODEL_FILES:
            raise pytest.UsageError(
                f"{item.nodeid} runs the embedded model: add its file to "
                "EMBEDDED_MODEL_FILES in tests/conftest.py"
            )
    if hasattr(config, "workerinput"):
        seconds = scope_seconds({xdist_scope(i.nodeid) for i in items})
        # A stable sort: ties keep collection order, the same on every worker.
        items.sort(key=lambda item: -seconds[xdist_scope(item.nodeid)])


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    existing = os.environ.get("KEEL_TEST_TEMPORAL_ADDRESS")
    if existing:
        yield existing
        return
    d = tmp_path_factory.mktemp("temporal")
    server = TemporalDevServer(
        db_file=d / "temporal.db", log_path=d / "temporal.log", port=free_port(), ui_port=None
    )
    server.start()
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture
def settings(tmp_path: Path, temporal_address: str) -> Settings:
    """Settings for one test: its own data dir, SQLite file and task queue."""
    return Settings(
        env="test",
        data_dir=tmp_path / "keel",
        temporal_address=temporal_address,
        task_queue=f"keel-test-{uuid.uuid4()}",
        webhook_url="",
        # Exact origins only: a test that delivers webhooks allows its receiver's URL.
        webhook_allowed_prefixes=[],
        metrics_port=0,
    )


@pytest.fixture(scope="session")
async def client(temporal_address: str) -> Client:
    return await connect(Settings(temporal_address=temporal_address))


@pytest.fixture
async def worker(client: Client, settings: Settings) -> AsyncIterator[Worker]:
    """A running Keel worker on this test's task queue."""
    w = build_worker(client, settings)
    async with w:
        yield w


@pytest.fixture(scope="session")
def local_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelServer]:
    """The embedded local model (llama.cpp) on a free port, one per test session (xdist
    worker): it keeps no state between requests, and loading it takes seconds.

    Only for tests that skip without llama_cpp: with llama_cpp installed the weights must be
    too, so a missing model is a failure here, not a skip.
    """
    assert unavailable_reason() is None, unavailable_reason()
    log = tmp_path_factory.mktemp("model-server") / "server.log"
    # One thread: the other xdist worker keeps the second core busy, and llama.cpp's
    # threads spin while one of them waits for a core (services/model_server.py).
    server = LocalModelServer(port=free_port(), threads=1, ctx=2048, log_path=log)
    server.start(timeout_s=180)
    try:
        yield server
    finally:
        server.stop()
    assert server.pid is None


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """``settings`` with the API callers of tests/support/api.py."""
    return with_tokens(settings)


@pytest.fixture
async def http(
    api_settings: Settings, client: Client, worker: Worker
) -> AsyncIterator[httpx.AsyncClient]:
    """The API app in process, over this test's worker."""
    async with asgi_client(create_app(api_settings, client=client)) as c:
        yield c


# --- SQL ---------------------------------------------------------------------------------
_backends: list[Any] = ["sqlite"]
if POSTGRES_URL:
    _backends.append(pytest.param("postgresql", marks=pytest.mark.postgres))


@pytest.fixture(params=_backends)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an empty database: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sub' / 'keel.db'}"
        dispose_engines()
        return
    schema = f"keel_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    # search_path puts every table (and alembic_version) of this test in its own schema.
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sm(db_url: str) -> sessionmaker[Session]:
    return get_sessionmaker(db_url)


# KEEL_TEST_CPU_LOG=FILE: one JSON line per test with the CPU seconds it cost, this
# process's own and its reaped children's (the servers, workers and CLIs a test starts
# and stops), to find where the suite's time goes on a machine it keeps busy. Session-wide
# servers are charged to the test that stops them; daemons nobody reaps are not counted.
_CPU_LOG = os.environ.get("KEEL_TEST_CPU_LOG")


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        import resource
        import time

        def cpu() -> tuple[float, float]:
            own = resource.getrusage(resource.RUSAGE_SELF)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

        (own0, kids0), wall0 = cpu(), time.monotonic()
        yield
        (own1, kids1), wall1 = cpu(), time.monotonic()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{_CPU_LOG}.{worker}", "a") as f:
            line = {
                "test": item.nodeid,
                "own": round(own1 - own0, 3),
                "children": round(kids1 - kids0, 3),
                "wall": round(wall1 - wall0, 3),
            }
            f.write(json.dumps(line) + "\n")
