"""Tracing and metrics for Keel processes.

Metrics: the Temporal runtime serves Prometheus on ``KEEL_METRICS_PORT`` with its own
worker metrics, and Keel's counters (LLM calls and tokens, ...) are created through
``activity.metric_meter()`` so they come out on the same endpoint. Tracing: OpenTelemetry
spans for every workflow, activity, signal and update through Temporal's interceptor.
"""

from __future__ import annotations

import logging

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from keel.settings import Settings

log = logging.getLogger(__name__)
_tracing_ready = False


def make_runtime(settings: Settings) -> Runtime | None:
    """A Temporal runtime exporting Prometheus metrics on loopback, or None when off."""
    if not settings.metrics_port:
        return None
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"127.0.0.1:{settings.metrics_port}")
        )
    )


def init_tracing(settings: Settings) -> None:
    """Install an OpenTelemetry tracer provider once per process (console or OTLP exporter)."""
    global _tracing_ready
    if _tracing_ready or settings.otel_exporter == "none":
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    exporter: SpanExporter
    if settings.otel_exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as err:
            raise RuntimeError(
                "KEEL_OTEL_EXPORTER=otlp needs opentelemetry-exporter-otlp installed"
            ) from err
        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "keel"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracing_ready = True
