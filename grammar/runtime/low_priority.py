"""Threads at the lowest CPU priority, for grammar work whose cost is not known in advance.

The compile-time fill probe (grammar/xgrammar/backend.py) exists to find grammars whose bitmask
fills take seconds; finding one costs those seconds of CPU. On a machine whose cores the forward
pass's threads already use, that CPU would come out of every running request's step. In Linux's
idle scheduling class the probe runs in the gaps the forward pass leaves, and a heavy grammar
delays only its own compile.

The idle class has no floor: while other processes keep every core busy, its threads never run,
and the request waiting on them would wait for good. So a job still unfinished after
STARVED_AFTER_S of wall time has its pool's threads moved to the normal class at nice 19 (a small
but certain share of a core); each thread goes back to the idle class when it takes its next job.
Time limits on this work are measured in the thread's CPU time, which priority does not change.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, TypeVar

logger = logging.getLogger(__name__)

LOWEST_PRIORITY = 19  # the highest nice value Linux allows
# wall time a job may wait in the idle class before its threads are given a normal (nice 19) share:
# far above a quiet machine's gaps between forward passes, far below a request's patience
STARVED_AFTER_S = 0.5

T = TypeVar("T")


def lower_current_thread_priority() -> bool:
    """Put the calling thread in Linux's SCHED_IDLE class (it runs only when no normal thread
    wants the core, and yields the moment one wakes: a nice value alone still delays the forward
    pass's threads at each of their many wake-ups) at nice 19. Linux keeps both per thread; any
    user may lower them. False where the platform cannot, in which case nothing changes."""
    return _set_class(threading.get_native_id(), idle=True)


class IdleClassPool:
    """A thread pool whose jobs start in the idle class and are never starved: `promote_starved`
    (called by whoever waits on the jobs) moves the threads to nice 19 once a job has waited
    STARVED_AFTER_S; each thread returns to the idle class at its next job."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._thread_ids: set[int] = set()
        self._lock = threading.Lock()
        self._started: dict[Future, float] = {}  # unfinished job -> when it was submitted (monotonic s)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix,
                                        initializer=self._register_thread)

    def submit(self, fn: Callable[..., T], *args) -> Future[T]:
        future = self._pool.submit(self._run, fn, *args)
        with self._lock:
            self._started[future] = time.monotonic()
        future.add_done_callback(self._forget)
        return future

    def promote_starved(self) -> bool:
        """Give the threads a normal share if a job has waited STARVED_AFTER_S; True if it did."""
        now = time.monotonic()
        with self._lock:
            starved = any(now - t >= STARVED_AFTER_S for t in self._started.values())
            thread_ids = list(self._thread_ids) if starved else []
        for thread_id in thread_ids:
            _set_class(thread_id, idle=False)
        return starved

    def result(self, future: Future[T]) -> T:
        """The job's result, promoting its threads if it starves."""
        while True:
            try:
                return future.result(timeout=STARVED_AFTER_S)
            except FutureTimeout:
                self.promote_starved()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _register_thread(self) -> None:
        with self._lock:
            self._thread_ids.add(threading.get_native_id())
        lower_current_thread_priority()

    @staticmethod
    def _run(fn: Callable[..., T], *args) -> T:
        lower_current_thread_priority()  # a thread promoted for an earlier job goes back
        return fn(*args)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._started.pop(future, None)


_pool: IdleClassPool | None = None
_pool_lock = threading.Lock()


def run_at_low_priority(fn: Callable[..., T], *args) -> T:
    """fn(*args) on the shared low-priority thread; blocks until it returns (or raises)."""
    pool = _shared_pool()
    return pool.result(pool.submit(fn, *args))


def _shared_pool() -> IdleClassPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = IdleClassPool(1, thread_name_prefix="grammar-probe")
        return _pool


def _set_class(thread_id: int, idle: bool) -> bool:
    """The thread in the idle class at nice 19, or in the normal class at nice 19."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, max(LOWEST_PRIORITY, os.getpriority(os.PRIO_PROCESS, thread_id)))
        os.sched_setscheduler(thread_id, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        return True
    except (OSError, AttributeError) as e:
        logger.warning("could not set the grammar thread's scheduling class: %s", e)
        return False
