"""OpenTelemetry tracing of requests, off unless `formwork serve --otlp-endpoint URL` turns it on.

    gRPC call / HTTP request   the server span, from OpenTelemetry's gRPC and ASGI instrumentation
                               (W3C `traceparent` taken from the metadata / headers), with the
                               engine's timings and token counts as attributes once the request ends
      ├─ queue                 arrival -> first scheduled (includes the grammar wait)
      ├─ grammar_wait          arrival -> grammar compiled (constrained requests)
      ├─ prefill               first scheduled -> first output token
      └─ decode                first output token -> finished

The child spans are written when the request ends, with the times the engine measured, so tracing
adds nothing to a step. This module is the only one that imports OpenTelemetry; the tracer provider
is the server's own (never the process-wide global), so tests can export to memory.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from engine.frontend.output_processor import RequestOutput
    from grammar.constraint import Constraint

# routes that are polled, not requested: no spans for them
_UNTRACED_URLS = "/health,/metrics"


class Tracing:
    """The server's tracer provider and the instrumentation built on it."""

    def __init__(self, exporter: SpanExporter, batch: bool = True, service_name: str = "formwork") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("formwork")

    @classmethod
    def to_otlp(cls, endpoint: str) -> Tracing:
        """Export over OTLP/HTTP (protobuf) to a collector, e.g. http://127.0.0.1:4318/v1/traces."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return cls(OTLPSpanExporter(endpoint=endpoint))

    def grpc_interceptor(self, service: str) -> Any:
        """A grpc.aio server interceptor: one span per call of `service` (not health checks or
        reflection), parented by the caller's trace context. Streaming handlers must be async
        generators: the instrumentation iterates them."""
        from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
        return aio_server_interceptor(tracer_provider=self.provider, filter_=filters.service_name(service))

    def asgi_app(self, app: Any) -> Any:
        """`app` wrapped so that each HTTP request gets a span, parented by its `traceparent` header."""
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.util.http import parse_excluded_urls
        # no spans per ASGI message: a stream would get one per event
        return OpenTelemetryMiddleware(app, excluded_urls=parse_excluded_urls(_UNTRACED_URLS),
                                       tracer_provider=self.provider, exclude_spans=["receive", "send"])

    def request_finished(self, output: RequestOutput, constraint: Constraint | None, arrival_time: float) -> None:
        """Annotate the current server span with a finished request, and add its phases as child
        spans. `arrival_time` is time.monotonic() at arrival, the clock of the output's timings."""
        span = trace.get_current_span()
        if not span.is_recording():
            return
        timings = output.timings
        attributes: dict[str, Any] = {
            "formwork.request_id": output.request_id,
            "formwork.finish_reason": output.finish_reason.name.lower() if output.finish_reason is not None else "",
            "formwork.constraint": constraint.kind if constraint is not None else "none",
            "formwork.grammar_cache_hit": output.grammar_cache_hit,
            "formwork.num_cached_tokens": output.counters.num_cached_tokens,
            "formwork.num_forced_tokens": output.counters.num_forced_tokens,
            "gen_ai.usage.input_tokens": output.num_prompt_tokens,
            "gen_ai.usage.output_tokens": output.num_output_tokens,
        }
        if timings is not None:
            attributes.update({"formwork.queued_s": timings.queued_s, "formwork.grammar_wait_s": timings.grammar_wait_s,
                               "formwork.ttft_s": timings.ttft_s, "formwork.total_s": timings.total_s})
        span.set_attributes(attributes)
        if timings is None:
            return
        # monotonic seconds -> epoch nanoseconds, which spans are stamped in
        offset_ns = time.time_ns() - time.monotonic_ns()

        def at(seconds_after_arrival: float) -> int:
            return int((arrival_time + seconds_after_arrival) * 1e9) + offset_ns

        phases = [("queue", 0.0, timings.queued_s)]
        if constraint is not None:
            phases.append(("grammar_wait", 0.0, timings.grammar_wait_s))
        if output.num_output_tokens:
            phases += [("prefill", timings.queued_s, timings.ttft_s), ("decode", timings.ttft_s, timings.total_s)]
        for name, start_s, end_s in phases:
            child = self.tracer.start_span(name, start_time=at(start_s),
                                           attributes={"formwork.request_id": output.request_id})
            child.end(end_time=at(max(end_s, start_s)))

    def shutdown(self) -> None:
        """Export what is buffered and stop."""
        self.provider.shutdown()
