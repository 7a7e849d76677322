"""One engine step's time split, measured by a context manager around the step."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.sched.scheduler_output import SchedulerOutput


@dataclass
class StepTiming:
    """One step that ran a forward pass: its size and where its time went (seconds).

    The wall times are what the step took, including any time its threads waited for a CPU that
    other processes held; the CPU times are what its threads ran, which they do not change."""

    num_reqs: int  # requests in the step's batch
    num_tokens: int  # tokens computed in the step
    num_bitmask_rows: int  # constrained requests whose bitmask row was filled
    schedule_s: float  # planning the step (drafting included), before the launch
    forward_s: float = 0.0  # execute_model in the worker thread
    fill_s: float = 0.0  # grammar bitmask fill on the engine thread, beside the forward
    wait_s: float = 0.0  # engine thread blocked on the forward after the fill
    sample_s: float = 0.0  # bitmask application + sampling
    total_s: float = 0.0  # launch -> outputs built
    engine_cpu_s: float = 0.0  # the engine thread's CPU time over the whole step, planning included
    fill_cpu_s: float = 0.0  # of that, the fill beside the forward
    forward_cpu_s: float = 0.0  # the forward thread's CPU time

    @property
    def wall_s(self) -> float:
        """Planning to outputs, as the clock on the wall saw it."""
        return self.schedule_s + self.total_s

    @property
    def busy_s(self) -> float:
        """What the step takes on a machine of its own: its threads' CPU time, with the fill beside
        the forward as the wall sees it (the longer of the two)."""
        return self.engine_cpu_s - self.fill_cpu_s + max(self.fill_cpu_s, self.forward_cpu_s)


class StepTimer:
    """Times the phases of one step, used as `with StepTimer(record) as timer:` around it: the
    step calls `launched` once its plan is made and the forward starts, then `filled`, `waited` and
    `sampled` as each phase ends; on leaving the block (without an exception) the StepTiming goes to
    `record`, once. A step that launched no forward pass records nothing. Only the engine thread's
    time is measured here: the forward's is the runner's."""

    __slots__ = ("_record", "_start", "_start_cpu", "_launch", "_launch_cpu", "_last", "timing")

    def __init__(self, record: Callable[[StepTiming], None]) -> None:
        self._record = record
        self.timing: StepTiming | None = None

    def __enter__(self) -> StepTimer:
        self._start, self._start_cpu = time.perf_counter(), time.thread_time()
        return self

    def launched(self, scheduler_output: SchedulerOutput) -> None:
        self._launch, self._launch_cpu = time.perf_counter(), time.thread_time()
        self._last = self._launch
        self.timing = StepTiming(num_reqs=len(scheduler_output.num_scheduled_tokens),
                                 num_tokens=scheduler_output.total_num_scheduled_tokens,
                                 num_bitmask_rows=len(scheduler_output.structured_output_request_ids),
                                 schedule_s=self._launch - self._start)

    def filled(self) -> None:
        self.timing.fill_s = self._lap()
        self.timing.fill_cpu_s = time.thread_time() - self._launch_cpu

    def waited(self) -> None:
        self.timing.wait_s = self._lap()

    def sampled(self) -> None:
        self.timing.sample_s = self._lap()

    def _lap(self) -> float:
        """Seconds since the last phase ended (or the launch)."""
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        return seconds

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        timing = self.timing
        if exc_type is None and timing is not None:
            timing.total_s = time.perf_counter() - self._launch
            timing.engine_cpu_s = time.thread_time() - self._start_cpu
            self._record(timing)
