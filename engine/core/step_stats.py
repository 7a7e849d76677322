"""The engine's side of the metrics: a few numbers per step, shipped with the next outputs.

Each step that runs a forward pass appends its batch size and time split (a handful of list
appends; nothing per token). `take` hands everything since the last call to the front end as one
StepStats, with the scheduler's and the grammar compiler's running totals; the front end owns the
Prometheus objects (service/metrics.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.protocol import StepStats

if TYPE_CHECKING:
    from engine.sched.scheduler import Scheduler
    from grammar.compiler import GrammarCompiler

# steps kept for a reader that has not taken them (the offline LLM never does): then start over
_MAX_PENDING_STEPS = 1 << 16


class StepStatsCollector:
    """Driven from the engine thread only (record_step and take)."""

    def __init__(self) -> None:
        self._pending = StepStats()

    def record_step(self, num_reqs: int, num_tokens: int, num_bitmask_rows: int, forward_s: float, fill_s: float,
                    wait_s: float, sample_s: float, total_s: float) -> None:
        pending = self._pending
        if len(pending.num_reqs) >= _MAX_PENDING_STEPS:
            pending = self._pending = StepStats()
        pending.num_reqs.append(num_reqs)
        pending.num_tokens.append(num_tokens)
        pending.num_bitmask_rows.append(num_bitmask_rows)
        pending.forward_s.append(forward_s)
        pending.fill_s.append(fill_s)
        pending.wait_s.append(wait_s)
        pending.sample_s.append(sample_s)
        pending.total_s.append(total_s)

    def take(self, scheduler: Scheduler, compiler: GrammarCompiler | None) -> StepStats:
        """Steps recorded since the last call, with the running totals as of now."""
        stats, self._pending = self._pending, StepStats()
        stats.num_steps = scheduler.num_steps
        stats.num_preemptions = scheduler.num_preemptions
        if compiler is not None:
            stats.compile_s = compiler.take_compile_times()
            stats.num_compile_cache_hits = compiler.num_hits
            stats.num_compile_cache_misses = compiler.num_misses
            stats.num_compile_cache_evictions = compiler.num_evictions
            stats.compile_failures = dict(compiler.failures)
        return stats
