"""The Keel HTTP API (FastAPI). ``keel api`` serves it; ``create_app`` builds it for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from temporalio.client import Client

from api.errors import install_error_handlers
from api.routes import design, design_files, gates, health, mrp, rllm, runs, srl, ui
from keel.settings import Settings
from store.db import get_sessionmaker


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    """The API app. Without ``client`` it connects to Temporal when it starts."""
    settings.check_secrets()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if client is None:
            from client.temporal import connect

            app.state.client = await connect(settings)
        yield

    app = FastAPI(
        title="Keel API",
        version="0.1.0",
        description="Durable workflows for AI work. Errors: {error: {code, message, details}}.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.client = client
    app.state.sessions = get_sessionmaker(settings.resolved_database_url)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(gates.router)
    app.include_router(rllm.router)
    app.include_router(mrp.router)
    app.include_router(srl.router)
    app.include_router(design.router)
    app.include_router(design_files.router)
    app.include_router(runs.router)
    app.include_router(ui.router)
    return app
