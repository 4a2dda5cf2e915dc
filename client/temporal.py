"""The one way Keel processes connect to Temporal: the pydantic converter always, and
OpenTelemetry tracing whenever an exporter is configured."""

from __future__ import annotations

import sys

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from keel.settings import Settings


async def connect(
    settings: Settings, *, address: str | None = None, runtime: Runtime | None = None
) -> Client:
    """Connect to the configured Temporal server (the embedded dev server by default)."""
    kwargs = {"runtime": runtime} if runtime is not None else {}
    interceptors: list[Interceptor] = []
    # Tracing is on when an exporter is configured (workers.telemetry installs the provider)
    # or the process installed an OpenTelemetry SDK provider itself (an embedding app, the
    # tests). Otherwise every span would be dropped, and the import alone costs each CLI
    # call 75-150 ms (bench/cli_latency.py).
    if settings.otel_exporter != "none" or "opentelemetry.sdk.trace" in sys.modules:
        from temporalio.contrib.opentelemetry import TracingInterceptor

        interceptors.append(TracingInterceptor())
    return await Client.connect(
        address or settings.resolved_temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        interceptors=interceptors,
        **kwargs,  # type: ignore[arg-type]
    )
