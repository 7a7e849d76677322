"""Threads at the lowest CPU priority, for grammar work whose cost is not known in advance.

The compile-time fill probe (grammar/xgrammar/backend.py) exists to find grammars whose bitmask
fills take seconds; finding one costs those seconds of CPU. On a machine whose cores the forward
pass's threads already use, that CPU would come out of every running request's step. In Linux's
idle scheduling class the probe runs in the gaps the forward pass leaves, and a heavy grammar
delays only its own compile.

The idle class has almost no floor: while other processes keep every core busy its threads get a
fraction of a percent of a core, and a request waiting on them would wait for minutes. So once a
job's thread has waited STARVED_AFTER_S for a CPU (grammar/cpu_wait.py: time it wanted a core and
others held them all, not time it spent working in the gaps) the pool is starved, and its job
(with the jobs queued behind it STARVED_AFTER_S or longer) is rescued, by the first of these the
kernel and the job allow:

- restore: where the process may raise a thread's priority again (CAP_SYS_NICE, or an RLIMIT_NICE
  that covers the process's own nice value), the pool's threads move back to the normal class at
  the priority the pool was created with (the process's own), a fair share beside any other
  process; each thread goes back to the idle class when it takes its next job.
- rerun: elsewhere a thread in the idle class can never leave it (Linux lets an unprivileged
  thread lower its priority, never raise it). A job that is safe to run twice at once
  (`restartable`) then starts again on a normal-priority thread, and the first run to finish
  answers; the copy left in the idle class only uses CPU nobody else wants.
- normal: a job that is not restartable (it holds state another run would race on) cannot be
  rescued once running, so where the priority cannot be restored such a pool's threads are never
  demoted: a fair share is worth more than a quiet machine's spare cycles.

Time limits on this work are measured in the thread's CPU time, which priority does not change.
"""
from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, TypeVar

from grammar.cpu_wait import thread_cpu_wait_s

logger = logging.getLogger(__name__)

LOWEST_PRIORITY = 19  # the highest nice value Linux allows
# time a job's thread may wait for a CPU in the idle class before it is rescued (and a queued job
# wait for its turn): far above a quiet machine's gaps between forward passes, far below a
# request's patience
STARVED_AFTER_S = 0.5
_CAP_SYS_NICE = 23  # bit of the capability in /proc/self/status's CapEff

T = TypeVar("T")


class Rescue(enum.Enum):
    """How a pool rescues a starved job (see the module docstring)."""
    RESTORE = "restore"
    RERUN = "rerun"
    NORMAL = "normal"


class ThreadScheduling:
    """Linux's per-thread scheduling class and nice value. Other platforms: nothing changes."""

    def own_nice(self) -> int:
        """The calling thread's nice value (0 where nice values are not per thread)."""
        if not sys.platform.startswith("linux"):
            return 0
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def may_restore(self, nice: int) -> bool:
        """Whether a thread of this process may leave the idle class and lower its nice value back
        to `nice`: Linux asks for CAP_SYS_NICE, or an RLIMIT_NICE of at least 20 - nice."""
        if not sys.platform.startswith("linux"):
            return False
        return _has_cap_sys_nice(_read_status()) or _rlimit_allows(nice)

    def demote(self, thread_id: int) -> bool:
        """The thread in the idle class at nice 19 (it runs only when no normal thread wants the
        core, and yields the moment one wakes: a nice value alone still delays the forward pass's
        threads at each of their many wake-ups). False where the platform cannot."""
        return _set_class(thread_id, os.SCHED_IDLE if sys.platform.startswith("linux") else 0, LOWEST_PRIORITY)

    def restore(self, thread_id: int, nice: int) -> bool:
        """The thread in the normal class at `nice`; False where the kernel refuses."""
        return _set_class(thread_id, os.SCHED_OTHER if sys.platform.startswith("linux") else 0, nice)


@dataclass
class _Job:
    fn: Callable
    args: tuple
    submitted_s: float  # the pool's clock when it was submitted
    answer: Future  # what the submitter holds: the first run's result or error
    started: bool = False  # a run began on the pool's own thread
    thread_id: int | None = None  # that run's thread
    cpu_wait_at_start_s: float = 0.0  # that thread's wait for a CPU when the run began
    rescued: bool = False  # a run began on a normal-priority thread


class IdleClassPool:
    """A thread pool whose jobs start in the idle class and are never starved: `promote_starved`
    (called by whoever waits on the jobs, at least every STARVED_AFTER_S while they wait) rescues
    the starved jobs, as the module docstring describes.

    `restartable`: every job may run twice at once (no shared mutable state); a starved job may then
    start again elsewhere, and a second run's result is dropped."""

    def __init__(self, max_workers: int, thread_name_prefix: str, restartable: bool,
                 scheduling: ThreadScheduling | None = None, clock: Callable[[], float] = time.monotonic,
                 cpu_wait_s: Callable[[int], float] = thread_cpu_wait_s) -> None:
        """`scheduling`, `clock` (monotonic s) and `cpu_wait_s` (a thread's wait for a CPU by native
        id, s) are the kernel's unless given."""
        self._scheduling = scheduling or ThreadScheduling()
        self._clock = clock
        self._cpu_wait_s = cpu_wait_s
        self._nice = self._scheduling.own_nice()  # what a promoted thread gets back
        if self._scheduling.may_restore(self._nice):
            self.rescue = Rescue.RESTORE
        else:
            self.rescue = Rescue.RERUN if restartable else Rescue.NORMAL
            logger.info("%s: this process may not raise a thread's priority back (no CAP_SYS_NICE, RLIMIT_NICE "
                        "below %d); starved grammar work is %s", thread_name_prefix, 20 - self._nice,
                        "run again at normal priority" if restartable else "never demoted")
        self._lock = threading.Lock()
        self._thread_ids: set[int] = set()
        self._jobs: dict[Future, _Job] = {}  # unfinished job's answer -> the job
        self._prefix = thread_name_prefix
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix,
                                        initializer=self._register_thread)
        self._reruns: list[threading.Thread] = []  # one thread per rerun: none waits behind another

    def submit(self, fn: Callable[..., T], *args) -> Future[T]:
        job = _Job(fn, args, self._clock(), Future())
        with self._lock:
            self._jobs[job.answer] = job
        job.answer.add_done_callback(self._forget)
        run = self._pool.submit(self._run_demoted, job)
        run.add_done_callback(lambda r: r.cancelled() and job.answer.cancel())  # shut down before it ran
        return job.answer

    def promote_starved(self) -> bool:
        """Rescue the jobs if one's thread has waited STARVED_AFTER_S for a CPU; True if it had."""
        now = self._clock()
        with self._lock:
            jobs = list(self._jobs.values())
        starving = [j for j in jobs if j.thread_id is not None
                    and self._cpu_wait_s(j.thread_id) - j.cpu_wait_at_start_s >= STARVED_AFTER_S]
        if not starving:
            return False
        queued = [j for j in jobs if j.thread_id is None and now - j.submitted_s >= STARVED_AFTER_S]
        with self._lock:
            thread_ids = list(self._thread_ids) if self.rescue is Rescue.RESTORE else []
            reruns = [j for j in starving + queued if self.rescue is Rescue.RERUN and not j.rescued]
            for job in reruns:
                job.rescued = True
        for thread_id in thread_ids:
            self._scheduling.restore(thread_id, self._nice)
        for job in reruns:
            # a new thread gets the priority of the thread that starts it: the waiter's, not the pool's
            thread = threading.Thread(target=self._run, args=(job,), name=f"{self._prefix}-rerun", daemon=True)
            with self._lock:
                self._reruns = [t for t in self._reruns if t.is_alive()] + [thread]
            thread.start()
        return True

    def result(self, future: Future[T]) -> T:
        """The job's result, rescuing it if it starves."""
        while True:
            try:
                return future.result(timeout=STARVED_AFTER_S)
            except FutureTimeout:
                self.promote_starved()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            with self._lock:
                reruns = list(self._reruns)
            for thread in reruns:
                thread.join()

    def _register_thread(self) -> None:
        with self._lock:
            self._thread_ids.add(threading.get_native_id())

    def _run_demoted(self, job: _Job) -> None:
        thread_id = threading.get_native_id()
        cpu_wait_s = self._cpu_wait_s(thread_id)
        with self._lock:
            if job.rescued and not job.started:
                return  # already rerun elsewhere
            job.started = True
            job.thread_id, job.cpu_wait_at_start_s = thread_id, cpu_wait_s
        if self.rescue is not Rescue.NORMAL:
            self._scheduling.demote(thread_id)  # also a thread promoted for an earlier job
        self._run(job)

    @staticmethod
    def _run(job: _Job) -> None:
        if job.answer.done():
            return
        try:
            result = job.fn(*job.args)
        except BaseException as e:  # handed to the submitter, as an executor would
            _settle(job.answer, error=e)
        else:
            _settle(job.answer, result=result)

    def _forget(self, answer: Future) -> None:
        with self._lock:
            self._jobs.pop(answer, None)


def _settle(answer: Future, result=None, error: BaseException | None = None) -> None:
    """The first run to finish answers; a later one (or one after a cancel) is dropped."""
    try:
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)
    except InvalidStateError:
        pass


_pool: IdleClassPool | None = None
_pool_lock = threading.Lock()


def run_at_low_priority(fn: Callable[..., T], *args) -> T:
    """fn(*args) on the shared low-priority thread; blocks until it returns (or raises). fn must
    be safe to run twice at once: a starved call may be run again at normal priority."""
    pool = _shared_pool()
    return pool.result(pool.submit(fn, *args))


def _shared_pool() -> IdleClassPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = IdleClassPool(1, thread_name_prefix="grammar-probe", restartable=True)
        return _pool


def _read_status() -> str:
    try:
        with open("/proc/self/status") as f:
            return f.read()
    except OSError:
        return ""


def _has_cap_sys_nice(status: str) -> bool:
    """From /proc/self/status's text: the effective capabilities include CAP_SYS_NICE."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    return False


def _rlimit_allows(nice: int, soft_limit: int | None = None) -> bool:
    """RLIMIT_NICE lets a thread lower its nice value down to 20 - limit (and leave the idle class,
    which counts as nice 20, only then)."""
    if soft_limit is None:
        import resource
        soft_limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft_limit == resource.RLIM_INFINITY:
            return True
    return 20 - nice <= soft_limit


def _set_class(thread_id: int, policy: int, nice: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        if policy == os.SCHED_IDLE:  # an unprivileged thread may raise its nice value, then leave the normal class
            os.setpriority(os.PRIO_PROCESS, thread_id, max(nice, os.getpriority(os.PRIO_PROCESS, thread_id)))
            os.sched_setscheduler(thread_id, policy, os.sched_param(0))
        else:  # leaving the idle class first, then lowering the nice value: both need the permission
            os.sched_setscheduler(thread_id, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, thread_id, nice)
        return True
    except (OSError, AttributeError) as e:
        logger.warning("could not set the grammar thread's scheduling class: %s", e)
        return False
