"""The one way Keel processes connect to Temporal: pydantic converter and tracing, always."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from keel.settings import Settings


async def connect(
    settings: Settings, *, address: str | None = None, runtime: Runtime | None = None
) -> Client:
    """Connect to the configured Temporal server (the embedded dev server by default)."""
    kwargs = {"runtime": runtime} if runtime is not None else {}
    return await Client.connect(
        address or settings.resolved_temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        interceptors=[TracingInterceptor()],
        **kwargs,  # type: ignore[arg-type]
    )
