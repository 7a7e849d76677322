"""Bitmask fills of lazily compiled grammars, on threads of their own.

A grammar whose token masks are built on first use (CompiledGrammar.lazy_masks) fills a state it
has seen in microseconds, but a state nobody has reached yet takes 10 ms to a second to build.
Filled on the engine thread, such a fill holds the step, and with it every running request's next
token. Here each of those requests' rows is filled on a small pool instead (xgrammar releases the
GIL while it fills), beside the forward pass, in Linux's idle scheduling class (as the compile's
fill probe, grammar/runtime/low_priority.py): a state being built takes the CPU the forward leaves, not the
core one of the forward's threads waits for at every kernel. A fill races on its request's matcher,
so it cannot be run twice: where the process may not raise a thread's priority back, the pool's
threads stay at normal priority rather than risk a fill starving in the idle class. After the forward, the step waits a
little for the fills still running (`collect`); a fill that is still building then is left to
finish on its own: its request skips this step's sample (its last token is computed again later)
and is not scheduled again until the row is ready, while everyone else's tokens go out on time.

A request's matcher is used by one thread at a time: while its fill is in flight the engine thread
neither schedules the request nor drafts for it, and the fill leaves the matcher where it was.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grammar.runtime.low_priority import IdleClassPool

if TYPE_CHECKING:
    import torch

    from grammar.backend import Grammar, GrammarBackend

# how long the step waits, after its forward, for the fills it started: warm fills take tens of
# µs, but on a busy machine the pool may only get a CPU once the forward's threads are done
COLLECT_WAIT_S = 0.005
_NUM_THREADS = 2  # one state being built does not hold up the other requests' fills


@dataclass
class LazyFill:
    future: Future[float]  # resolves to the fill's CPU time in ms; raises what the fill raised
    row: torch.Tensor  # [1, words]: the request's next-token row, once the future is done


class LazyFills:
    """Driven by the engine thread; the pool's threads only run `_fill`."""

    def __init__(self, backend: GrammarBackend) -> None:
        self._backend = backend
        self._pool = IdleClassPool(_NUM_THREADS, thread_name_prefix="formwork-lazy-fill",
                                   restartable=False)
        self._fills: dict[str, LazyFill] = {}  # req_id -> a fill not taken yet (running or done)

    def in_flight(self, req_id: str) -> bool:
        """The request's fill is still running: leave its matcher alone."""
        fill = self._fills.get(req_id)
        return fill is not None and not fill.future.done()

    def start(self, req_id: str, grammar: Grammar) -> None:
        """Fill the request's next row on the pool, unless a fill of it is there already (its
        grammar has not moved since: nothing is accepted while a fill is pending)."""
        if req_id in self._fills:
            return
        row = self._backend.allocate_bitmask(1)
        self._fills[req_id] = LazyFill(self._pool.submit(_fill, grammar, row), row)

    def collect(self, req_ids: list[str], bitmask: torch.Tensor, rows: dict[str, int],
                wait_s: float = COLLECT_WAIT_S) -> tuple[dict[str, float], dict[str, BaseException], set[str]]:
        """Copy the finished rows of `req_ids` into `bitmask` at `rows`, waiting up to `wait_s` in
        all for those still running: ({req_id: fill CPU ms}, {req_id: what its fill raised},
        {req_ids still filling}). Finished fills are taken; running ones stay for a later step."""
        pending = [self._fills[r].future for r in req_ids if not self._fills[r].future.done()]
        if pending:
            wait(pending, timeout=wait_s)
            self._pool.promote_starved()  # other processes may keep every core busy
        done_ms: dict[str, float] = {}
        failed: dict[str, BaseException] = {}
        deferred: set[str] = set()
        for req_id in req_ids:
            fill = self._fills[req_id]
            if not fill.future.done():
                deferred.add(req_id)
                continue
            del self._fills[req_id]
            error = fill.future.exception()
            if error is not None:
                failed[req_id] = error
                continue
            bitmask[rows[req_id]] = fill.row[0]
            done_ms[req_id] = fill.future.result()
        return done_ms, failed, deferred

    def running(self) -> list[Future[float]]:
        """The fills still running (an idle engine waits on them)."""
        return [f.future for f in self._fills.values() if not f.future.done()]

    @property
    def num_in_flight(self) -> int:
        return len(self.running())

    def promote_starved(self) -> None:
        """Fills kept waiting by other processes' load get a normal share of a core."""
        self._pool.promote_starved()

    def forget(self, req_id: str) -> None:
        """The request is gone: a fill still running finishes unseen."""
        self._fills.pop(req_id, None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _fill(grammar: Grammar, row: torch.Tensor) -> float:
    start = time.thread_time()  # CPU time: a preempted thread is not the grammar's fault
    grammar.fill_bitmask(row, 0)
    return (time.thread_time() - start) * 1000
