"""The grammar probe thread runs at the lowest CPU priority, hands back results and errors, and is
never starved by other processes that keep every core busy."""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

import pytest

from grammar.runtime.low_priority import LOWEST_PRIORITY, STARVED_AFTER_S, IdleClassPool, run_at_low_priority


def _own_priority() -> tuple[int, int, str]:
    tid = threading.get_native_id()
    return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid), threading.current_thread().name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_runs_on_an_idle_class_thread_and_leaves_the_caller_alone():
    caller = _own_priority()
    nice, policy, name = run_at_low_priority(_own_priority)
    assert (nice, policy) == (LOWEST_PRIORITY, os.SCHED_IDLE)
    assert name.startswith("grammar-probe")
    assert _own_priority() == caller


def test_returns_the_result_and_raises_the_error():
    assert run_at_low_priority(pow, 2, 10) == 1024
    with pytest.raises(ZeroDivisionError):
        run_at_low_priority(divmod, 1, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling classes are Linux's")
def test_a_starved_job_gets_a_normal_share_until_its_thread_takes_the_next_job():
    pool = IdleClassPool(1, thread_name_prefix="test-idle")
    release = threading.Event()
    try:
        held = pool.submit(lambda: (release.wait(10), _own_priority())[1])
        assert not pool.promote_starved()  # not waited long enough yet
        time.sleep(STARVED_AFTER_S + 0.1)
        assert pool.promote_starved()
        release.set()
        assert held.result(timeout=10)[:2] == (LOWEST_PRIORITY, os.SCHED_OTHER)
        assert pool.submit(_own_priority).result(timeout=10)[:2] == (LOWEST_PRIORITY, os.SCHED_IDLE)
    finally:
        release.set()
        pool.shutdown()


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling classes are Linux's")
def test_the_probe_finishes_while_other_processes_keep_every_core_busy():
    """In the idle class alone this job would never run; its wait is bounded by the promotion."""
    spinners = [multiprocessing.Process(target=_spin, args=(20.0,)) for _ in os.sched_getaffinity(0)]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.5)
        assert run_at_low_priority(sum, range(100_000)) == sum(range(100_000))
    finally:
        for p in spinners:
            p.terminate()
            p.join()
