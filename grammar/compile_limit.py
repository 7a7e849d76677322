"""A compile's own time, and the limit on it: wall time less the time its threads waited for a CPU
that other work held (a saturated machine slows a compile; it does not make the constraint too
complex). Used by GrammarCompiler for `compile_timeout_s`."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from grammar.backend import CompiledGrammar
    from grammar.constraint import Constraint
    from grammar.schema_worker import SchemaWorker

# the shortest wait before a limit that was excused a CPU wait is looked at again
_MIN_RECHECK_S = 0.05


class CompileRuns:
    """The runs of one compile (a starved one is run again at normal priority) and the time each
    has had a CPU."""

    def __init__(self, cpu_wait_s: Callable[[int], float]) -> None:
        self._cpu_wait_s = cpu_wait_s
        self._lock = threading.Lock()
        self._starts: list[tuple[int, float, float]] = []  # (thread id, start, its CPU wait then) per run

    def run(self, fn: Callable[[Constraint], CompiledGrammar], constraint: Constraint) -> CompiledGrammar:
        thread_id = threading.get_native_id()
        with self._lock:
            self._starts.append((thread_id, time.monotonic(), self._cpu_wait_s(thread_id)))
        return fn(constraint)

    def own_s(self) -> float:
        """The furthest run's time with a CPU: wall time since it started less what its thread
        waited for one meanwhile (0 before any run starts: a queued compile has done nothing)."""
        now = time.monotonic()
        with self._lock:
            starts = list(self._starts)
        return max((now - start - (self._cpu_wait_s(thread_id) - first_wait_s)
                    for thread_id, start, first_wait_s in starts), default=0.0)


class WithWorkerWaits:
    """A thread's wait for a CPU plus the schema worker's while it served that thread's calls."""

    def __init__(self, own_wait_s: Callable[[int], float], worker: SchemaWorker) -> None:
        self._own_wait_s, self._worker = own_wait_s, worker

    def __call__(self, thread_id: int) -> float:
        return self._own_wait_s(thread_id) + self._worker.waited_s(thread_id)


class LimitTimer:
    """Calls `expire` once `own_s()` (the compile's own time: wall time less the time it waited for
    a CPU, CompileRuns.own_s) reaches `limit_s`."""

    def __init__(self, limit_s: float, own_s: Callable[[], float], expire: Callable[[], None]) -> None:
        self._limit_s, self._own_s, self._expire = limit_s, own_s, expire
        self._lock = threading.Lock()
        self._cancelled = False
        self._timer: threading.Timer | None = None
        self._arm(limit_s)

    def _arm(self, delay_s: float) -> None:
        with self._lock:
            if not self._cancelled:
                self._timer = threading.Timer(delay_s, self._check)
                self._timer.daemon = True
                self._timer.start()

    def _check(self) -> None:
        own_s = self._own_s()
        if own_s < self._limit_s:  # kept from a CPU by other work: the rest of the limit still stands
            self._arm(max(self._limit_s - own_s, _MIN_RECHECK_S))
        else:
            self._expire()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._timer is not None:
                self._timer.cancel()
