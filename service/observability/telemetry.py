"""What the server records about its requests: metrics, one log line each, and trace spans.

AsyncLLM reports every request that ends (gRPC and HTTP alike) to `request_finished`, once, with
its final output; the servicers report the calls they refuse to `request_rejected`. Metrics are
optional (`--no-metrics`), tracing is optional (`--otlp-endpoint`), the log line is always written
(at INFO, logger service.request_log).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from service.observability.request_log import log_finished

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import StepStats
    from grammar.constraint import Constraint
    from service.observability.metrics import ServiceMetrics
    from service.observability.tracing import Tracing


class Telemetry:
    def __init__(self, metrics: ServiceMetrics | None = None, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    def request_finished(self, output: RequestOutput, constraint: Constraint | None, arrival_time: float) -> None:
        """`output` is the request's final one (finished, with timings)."""
        if self.metrics is not None:
            self.metrics.request_finished(output, constraint)
        if self.tracing is not None:
            self.tracing.request_finished(output, constraint, arrival_time)
        log_finished(output, constraint)

    def request_rejected(self, api: str, code: str) -> None:
        """A generation call (`api`: "grpc" or "http") answered with an error status (a gRPC code name)."""
        if self.metrics is not None:
            self.metrics.request_rejected(api, code)

    def engine_steps(self, stats: StepStats) -> None:
        if self.metrics is not None:
            self.metrics.engine_steps(stats)

    def engine_restarted(self) -> None:
        if self.metrics is not None:
            self.metrics.engine_restarted()

    def shutdown(self) -> None:
        if self.tracing is not None:
            self.tracing.shutdown()
