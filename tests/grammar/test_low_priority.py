"""The grammar probe thread runs at the lowest CPU priority, hands back results and errors, and is
never starved by other processes that keep every core busy: the rescue policy, with the clock and
the kernel's permission faked, then once on the real kernel."""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from grammar.runtime.low_priority import (
    LOWEST_PRIORITY, STARVED_AFTER_S, IdleClassPool, Rescue, ThreadScheduling, _has_cap_sys_nice, _rlimit_allows,
    run_at_low_priority,
)


class FakeScheduling(ThreadScheduling):
    """Records what the pool asks of the kernel; `permitted` stands for CAP_SYS_NICE/RLIMIT_NICE."""

    def __init__(self, permitted: bool) -> None:
        self.permitted = permitted
        self.calls: list[tuple[str, int]] = []  # ("demote" | "restore", nice after)
        self.lock = threading.Lock()

    def own_nice(self) -> int:
        return 5

    def may_restore(self, nice: int) -> bool:
        return self.permitted

    def demote(self, thread_id: int) -> bool:
        with self.lock:
            self.calls.append(("demote", LOWEST_PRIORITY))
        return True

    def restore(self, thread_id: int, nice: int) -> bool:
        with self.lock:
            self.calls.append(("restore", nice))
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def _pool(permitted: bool, restartable: bool, *events: threading.Event, starved: bool = True):
    """(pool, fake kernel, fake clock); `starved`: every moment of the clock is spent waiting for a
    CPU (else none is). On the way out `events` are set (what held jobs wait on) and the pool is
    shut down."""
    clock, scheduling = FakeClock(), FakeScheduling(permitted)
    pool = IdleClassPool(1, thread_name_prefix="test-idle", restartable=restartable, scheduling=scheduling,
                         clock=clock, cpu_wait_s=lambda thread_id: clock.now if starved else 0.0)
    try:
        yield pool, scheduling, clock
    finally:
        for event in events:
            event.set()
        pool.shutdown()


def test_where_permitted_a_starved_job_s_threads_get_the_pool_creator_s_priority_back():
    release = threading.Event()
    with _pool(True, False, release) as (pool, scheduling, clock):
        assert pool.rescue is Rescue.RESTORE
        held = pool.submit(release.wait, 10)
        assert not pool.promote_starved()  # not waited long enough yet
        clock.now += STARVED_AFTER_S
        assert pool.promote_starved()
        release.set()
        assert held.result(timeout=10) is True
        assert pool.submit(pow, 2, 3).result(timeout=10) == 8
        # demoted for each job; promoted to the creator's nice 5, not 19, in between
        assert scheduling.calls == [("demote", 19), ("restore", 5), ("demote", 19)]


@pytest.mark.parametrize("permitted", [True, False])
def test_a_job_that_gets_the_cpu_it_wants_is_left_in_the_idle_class_however_long_it_runs(permitted):
    release = threading.Event()
    with _pool(permitted, True, release, starved=False) as (pool, scheduling, clock):
        held = pool.submit(release.wait, 10)
        queued = pool.submit(pow, 2, 3)
        clock.now += 100 * STARVED_AFTER_S
        assert not pool.promote_starved()  # long, but working in the gaps: not starved
        release.set()
        assert held.result(timeout=10) is True and queued.result(timeout=10) == 8
        assert scheduling.calls == [("demote", 19)] * 2


def test_unpermitted_a_starved_running_job_runs_again_on_a_normal_thread_and_the_first_answer_wins():
    stuck = threading.Event()  # the idle-class run, as if the busy machine never gave it a core
    thread_names: list[str] = []

    def job() -> str:
        name = threading.current_thread().name
        thread_names.append(name)
        if "rerun" not in name:
            stuck.wait(10)
        return name

    with _pool(False, True, stuck) as (pool, scheduling, clock):
        assert pool.rescue is Rescue.RERUN
        answer = pool.submit(job)
        while not thread_names:  # the idle-class run has begun
            time.sleep(0.01)
        clock.now += STARVED_AFTER_S
        assert pool.promote_starved()
        assert "rerun" in answer.result(timeout=10)
        assert not pool.promote_starved()  # answered: nothing left to rescue
        stuck.set()
        pool.shutdown()
        assert len(thread_names) == 2 and "rerun" in answer.result()  # the late run's answer is dropped
        assert scheduling.calls == [("demote", 19)]  # never asked the kernel for what it refuses


def test_unpermitted_a_queued_starved_job_runs_once_on_a_normal_thread():
    first_running, release = threading.Event(), threading.Event()
    runs: list[str] = []
    with _pool(False, True, release) as (pool, _, clock):
        first = pool.submit(lambda: (first_running.set(), release.wait(10)))
        queued = pool.submit(lambda: runs.append(threading.current_thread().name) or len(runs))
        assert first_running.wait(10)
        clock.now += STARVED_AFTER_S
        pool.promote_starved()
        assert queued.result(timeout=10) == 1
        release.set()
        first.result(timeout=10)
        pool.shutdown()  # the idle thread reaches the queued job after its rerun: it is skipped
        assert len(runs) == 1 and "rerun" in runs[0]


def test_unpermitted_a_job_that_cannot_run_twice_is_never_demoted():
    with _pool(False, False) as (pool, scheduling, _):
        assert pool.rescue is Rescue.NORMAL
        assert pool.submit(divmod, 7, 2).result(timeout=10) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result(timeout=10)
        assert scheduling.calls == []


def test_the_permission_is_cap_sys_nice_or_an_rlimit_nice_that_covers_the_process_s_nice():
    assert _has_cap_sys_nice("Name:\tx\nCapEff:\t0000000000800000\n")  # bit 23 alone
    assert not _has_cap_sys_nice("Name:\tx\nCapEff:\t00000000ff7fffff\n")  # every bit but 23
    assert not _has_cap_sys_nice("")
    assert not _rlimit_allows(0, soft_limit=0)  # the usual default: no way back even from nice 19
    assert not _rlimit_allows(0, soft_limit=19)
    assert _rlimit_allows(0, soft_limit=20)
    assert _rlimit_allows(10, soft_limit=10)


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
def test_on_the_real_kernel_a_promoted_thread_is_back_at_the_creator_s_priority():
    scheduling = ThreadScheduling()
    if not scheduling.may_restore(scheduling.own_nice()):
        pytest.skip("this process may not raise a thread's priority (no CAP_SYS_NICE, RLIMIT_NICE too low)")
    clock = FakeClock()
    pool = IdleClassPool(1, thread_name_prefix="test-idle", restartable=False, clock=clock,
                         cpu_wait_s=lambda thread_id: clock.now)
    started = threading.Event()
    release = threading.Event()
    try:
        held = pool.submit(lambda: (started.set(), release.wait(10), _own_priority())[2])
        assert started.wait(10)
        clock.now += STARVED_AFTER_S
        assert pool.promote_starved()
        release.set()
        assert held.result(timeout=10)[:2] == (scheduling.own_nice(), os.SCHED_OTHER)
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
    """In the idle class alone this job would barely run; its wait is bounded by the rescue."""
    spinners = [multiprocessing.Process(target=_spin, args=(60.0,)) for _ in os.sched_getaffinity(0)]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.5)
        assert run_at_low_priority(sum, range(3_000_000)) == sum(range(3_000_000))
    finally:
        for p in spinners:
            p.terminate()
            p.join()
