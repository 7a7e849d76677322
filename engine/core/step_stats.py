"""The engine's side of the metrics: a few numbers per step, shipped with the next outputs.

Each step that runs a forward pass leaves its StepTiming here (engine/core/step_timer.py: its batch
size and time split; nothing per token). `take` hands everything since the last call to the front
end as one StepStats, with the scheduler's and the grammar compiler's running totals; the front end
owns the Prometheus objects (service/observability/metrics.py). Benchmarks read the steps themselves
(`take_timings`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.protocol import StepStats

if TYPE_CHECKING:
    from engine.core.step_timer import StepTiming
    from engine.sched.scheduler import Scheduler
    from grammar.compiler import GrammarCompiler

# steps kept for a reader that has not taken them (the offline LLM never does): then start over
_MAX_PENDING_STEPS = 1 << 16


class StepStatsCollector:
    """Driven from the engine thread only (record_step and take)."""

    def __init__(self) -> None:
        self._pending: list[StepTiming] = []

    def record_step(self, timing: StepTiming) -> None:
        if len(self._pending) >= _MAX_PENDING_STEPS:
            self._pending = []
        self._pending.append(timing)

    def take_timings(self) -> list[StepTiming]:
        """The steps recorded since the last take (benchmarks)."""
        timings, self._pending = self._pending, []
        return timings

    def take(self, scheduler: Scheduler, compiler: GrammarCompiler | None) -> StepStats:
        """Steps recorded since the last call, with the running totals as of now."""
        timings = self.take_timings()
        stats = StepStats(
            num_reqs=[t.num_reqs for t in timings], num_tokens=[t.num_tokens for t in timings],
            num_bitmask_rows=[t.num_bitmask_rows for t in timings], forward_s=[t.forward_s for t in timings],
            fill_s=[t.fill_s for t in timings], wait_s=[t.wait_s for t in timings],
            sample_s=[t.sample_s for t in timings], total_s=[t.total_s for t in timings])
        stats.num_steps = scheduler.num_steps
        stats.num_preemptions = scheduler.num_preemptions
        if compiler is not None:
            compiles = compiler.take_compile_times()
            stats.compile_backends = [backend for backend, _ in compiles]
            stats.compile_s = [seconds for _, seconds in compiles]
            stats.num_compile_cache_hits = compiler.num_hits
            stats.num_compile_cache_misses = compiler.num_misses
            stats.num_compile_cache_evictions = compiler.num_evictions
            stats.compile_failures = {backend: dict(counts) for backend, counts in compiler.failures.items()}
        return stats
