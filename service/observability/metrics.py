"""The server's Prometheus metrics (docs/observability.md names each one and its vLLM counterpart).

One registry per server, in the front end's process: the engine core sends its per-step numbers
with its outputs (StepStats: lists of step timings plus running totals), so nothing has to be shared
between processes (no prometheus_client multiprocess mode). Per request, the front end observes the
final output once; per step, the numbers the engine appended. Nothing per token.

    gauges      read from the engine at each scrape (GetStats), so they are never stale
    counters    requests and tokens from the final outputs; engine totals (preemptions, compiles)
                as the growth of the totals the engine reports
    histograms  request latencies from the final outputs; step times and batch sizes from StepStats
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from engine.protocol import EngineStats, StepStats
    from grammar.constraint import Constraint

CONTENT_TYPE = CONTENT_TYPE_LATEST
# no `_created` series beside every counter and histogram (as vLLM does): they double the exposition
disable_created_metrics()

# seconds; a CPU server's first tokens can take tens of seconds at full batch
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_FILL_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25)
_COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
STEP_PHASES = ("forward", "fill", "wait", "sample", "total")


class ServiceMetrics:
    """Not thread-safe in its bookkeeping of engine totals: call it from the server's event loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # ---- gauges (set at scrape time) ----
        self.num_running = Gauge("formwork_num_requests_running", "Requests in the engine's running batch", registry=r)
        self.num_waiting = Gauge("formwork_num_requests_waiting", "Requests waiting for a batch slot", registry=r)
        self.num_waiting_for_grammar = Gauge("formwork_num_requests_waiting_for_grammar",
                                             "Requests waiting for their grammar to compile", registry=r)
        self.num_in_flight = Gauge("formwork_num_requests_in_flight",
                                   "Requests admitted by the front end and not finished", registry=r)
        self.kv_blocks_used = Gauge("formwork_kv_cache_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_blocks_total = Gauge("formwork_kv_cache_blocks_capacity", "KV cache blocks requests can use", registry=r)
        self.prefix_cache_blocks = Gauge("formwork_prefix_cache_blocks",
                                         "KV cache blocks holding a cached prompt prefix", registry=r)
        # ---- counters: requests and tokens ----
        self.requests = Counter("formwork_requests", "Finished requests by finish reason and constraint kind",
                                ("finish_reason", "constraint"), registry=r)
        self.rejected = Counter("formwork_requests_rejected", "Generation calls answered with an error status",
                                ("api", "code"), registry=r)
        self.closed_early = Counter("formwork_requests_closed_early",
                                    "Constrained answers the engine completed itself, by why: budget (max_tokens or "
                                    "the context about to run out), repetition, digits or depth (a runaway loop)",
                                    ("reason",), registry=r)
        self.prompt_tokens = Counter("formwork_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("formwork_generation_tokens",
                                         "Output tokens of finished requests (sampled and forced)", registry=r)
        self.cached_tokens = Counter("formwork_prompt_tokens_cached",
                                     "Prompt tokens served from the prefix cache", registry=r)
        self.forced_tokens = Counter("formwork_forced_tokens",
                                     "Output tokens the grammar forced (jump-forward), not sampled", registry=r)
        self.draft_tokens = Counter("formwork_spec_decode_draft_tokens",
                                    "Draft tokens verified (speculative decoding), finished requests", registry=r)
        self.accepted_draft_tokens = Counter("formwork_spec_decode_accepted_tokens",
                                             "Draft tokens the model accepted, finished requests", registry=r)
        # ---- counters: engine totals ----
        self.steps = Counter("formwork_engine_steps", "Engine steps", registry=r)
        self.preemptions = Counter("formwork_preemptions", "Requests preempted for want of KV blocks", registry=r)
        self.compiles = Counter("formwork_grammar_compiles", "Grammar compiles started (compile-cache misses)",
                                registry=r)
        self.compile_cache_hits = Counter("formwork_grammar_compile_cache_hits",
                                          "Constraints served from the compile cache", registry=r)
        self.compile_cache_misses = Counter("formwork_grammar_compile_cache_misses",
                                            "Constraints not in the compile cache", registry=r)
        self.compile_cache_evictions = Counter("formwork_grammar_compile_cache_evictions",
                                               "Compiled grammars evicted from the compile cache", registry=r)
        # backend: the grammar library asked for ("auto" included), as failures have no other
        self.compile_failures = Counter("formwork_grammar_compile_failures", "Constraints that failed to compile",
                                        ("reason", "backend"), registry=r)
        # ---- histograms: per request ----
        self.ttft = Histogram("formwork_time_to_first_token_seconds", "Arrival to the first output token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("formwork_inter_token_latency_seconds",
                                     "A request's mean time between output tokens after the first",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("formwork_e2e_request_latency_seconds", "Arrival to finish",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("formwork_request_queue_time_seconds", "Arrival to first scheduled",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.grammar_wait = Histogram("formwork_grammar_wait_seconds",
                                      "Arrival to grammar compiled, constrained requests", buckets=_LATENCY_BUCKETS,
                                      registry=r)
        # ---- histograms: per step and per compile ----
        # backend: the grammar library that compiled it (the one asked for when it failed)
        self.compile_time = Histogram("formwork_grammar_compile_seconds", "Time one grammar compile took",
                                      ("backend",), buckets=_COMPILE_BUCKETS, registry=r)
        self.bitmask_fill = Histogram("formwork_grammar_bitmask_fill_seconds",
                                      "Bitmask fill of one step's constrained requests", buckets=_FILL_BUCKETS,
                                      registry=r)
        self.step_time = Histogram("formwork_step_seconds", "Engine step time by phase", ("phase",),
                                   buckets=_STEP_BUCKETS, registry=r)
        self.batch_size = Histogram("formwork_step_batch_size", "Requests in one step's batch",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.step_tokens = Histogram("formwork_step_tokens", "Tokens computed in one step", buckets=_TOKEN_BUCKETS,
                                     registry=r)
        self._step_phases = {phase: self.step_time.labels(phase) for phase in STEP_PHASES}
        # the engine's totals as last reported: counters grow by the difference
        self._totals: dict[str, int] = {}

    # ---- per request --------------------------------------------------------------------------

    def request_finished(self, output: RequestOutput, constraint: Constraint | None) -> None:
        """Count one finished request (its final output: finished, with timings)."""
        reason = "none" if output.finish_reason is None else output.finish_reason.name.lower()
        self.requests.labels(reason, constraint.kind if constraint is not None else "none").inc()
        self.prompt_tokens.inc(output.num_prompt_tokens)
        self.generation_tokens.inc(output.num_output_tokens)
        counters = output.counters
        self.cached_tokens.inc(counters.num_cached_tokens)
        self.forced_tokens.inc(counters.num_forced_tokens)
        self.draft_tokens.inc(counters.num_draft_tokens)
        self.accepted_draft_tokens.inc(counters.num_accepted_draft_tokens)
        if output.closed_early:
            self.closed_early.labels(output.closed_early).inc()
        timings = output.timings
        if timings is None:
            return
        self.e2e.observe(timings.total_s)
        if constraint is not None:
            self.grammar_wait.observe(timings.grammar_wait_s)
        if output.num_output_tokens:  # it was scheduled and produced a token
            self.queue_time.observe(timings.queued_s)
            self.ttft.observe(timings.ttft_s)
            if output.num_output_tokens > 1:
                self.inter_token.observe((timings.total_s - timings.ttft_s) / (output.num_output_tokens - 1))

    def request_rejected(self, api: str, code: str) -> None:
        self.rejected.labels(api, code).inc()

    # ---- from the engine ----------------------------------------------------------------------

    def engine_steps(self, stats: StepStats) -> None:
        """Absorb one StepStats from the engine core."""
        phases = self._step_phases
        for column, phase in ((stats.forward_s, "forward"), (stats.fill_s, "fill"), (stats.wait_s, "wait"),
                              (stats.sample_s, "sample"), (stats.total_s, "total")):
            histogram = phases[phase]
            for seconds in column:
                histogram.observe(seconds)
        for num_reqs, num_tokens, num_rows, fill_s in zip(stats.num_reqs, stats.num_tokens, stats.num_bitmask_rows,
                                                          stats.fill_s):
            self.batch_size.observe(num_reqs)
            self.step_tokens.observe(num_tokens)
            if num_rows:
                self.bitmask_fill.observe(fill_s)
        for backend, seconds in zip(stats.compile_backends, stats.compile_s):
            self.compile_time.labels(backend).observe(seconds)
        self._grow(self.steps, "steps", stats.num_steps)
        self._grow(self.preemptions, "preemptions", stats.num_preemptions)
        self._grow(self.compile_cache_hits, "hits", stats.num_compile_cache_hits)
        self._grow(self.compile_cache_misses, "misses", stats.num_compile_cache_misses)
        self._grow(self.compiles, "compiles", stats.num_compile_cache_misses)
        self._grow(self.compile_cache_evictions, "evictions", stats.num_compile_cache_evictions)
        for backend, counts in stats.compile_failures.items():
            for reason, total in counts.items():
                self._grow(self.compile_failures.labels(reason, backend), f"failures:{backend}:{reason}", total)

    def _grow(self, counter: Counter, name: str, total: int) -> None:
        last = self._totals.get(name, 0)
        # a smaller total: a new engine process started from zero
        counter.inc(total - last if total >= last else total)
        self._totals[name] = total

    def engine_restarted(self) -> None:
        """A new engine core reports totals from zero (called when one starts)."""
        self._totals.clear()

    # ---- scraping -----------------------------------------------------------------------------

    def render(self, stats: EngineStats | None, num_in_flight: int) -> bytes:
        """The exposition, with the gauges set from `stats` (None: the engine is down; they keep
        their last values)."""
        self.num_in_flight.set(num_in_flight)
        if stats is not None:
            self.num_running.set(stats.num_running)
            self.num_waiting.set(stats.num_waiting)
            self.num_waiting_for_grammar.set(stats.num_waiting_for_grammar)
            self.kv_blocks_total.set(stats.num_total_blocks)
            self.kv_blocks_used.set(stats.num_total_blocks - stats.num_free_blocks)
            self.prefix_cache_blocks.set(stats.num_cached_blocks)
        return generate_latest(self.registry)
