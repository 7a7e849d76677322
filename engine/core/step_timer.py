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
    """One step that ran a forward pass: its size and where its time went (seconds)."""

    num_reqs: int  # requests in the step's batch
    num_tokens: int  # tokens computed in the step
    num_bitmask_rows: int  # constrained requests whose bitmask row was filled
    schedule_s: float  # planning the step (drafting included), before the launch
    forward_s: float = 0.0  # execute_model in the worker thread
    fill_s: float = 0.0  # grammar bitmask fill on the engine thread, beside the forward
    wait_s: float = 0.0  # engine thread blocked on the forward after the fill
    sample_s: float = 0.0  # bitmask application + sampling
    total_s: float = 0.0  # launch -> outputs built


class StepTimer:
    """Times the phases of one step, used as `with StepTimer(record) as timer:` around it: the
    step calls `launched` once its plan is made and `lap(phase)` at the end of each phase, and on
    leaving the block (without an exception) the StepTiming goes to `record`, once. A step that
    launched no forward pass records nothing."""

    __slots__ = ("_record", "_start", "_launch", "_last", "timing")

    def __init__(self, record: Callable[[StepTiming], None]) -> None:
        self._record = record
        self.timing: StepTiming | None = None

    def __enter__(self) -> StepTimer:
        self._start = time.perf_counter()
        return self

    def launched(self, scheduler_output: SchedulerOutput) -> None:
        """The plan is made and the forward starts: the phases after this are the step's own."""
        self._launch = self._last = time.perf_counter()
        self.timing = StepTiming(num_reqs=len(scheduler_output.num_scheduled_tokens),
                                 num_tokens=scheduler_output.total_num_scheduled_tokens,
                                 num_bitmask_rows=len(scheduler_output.structured_output_request_ids),
                                 schedule_s=self._launch - self._start)

    def lap(self, phase: str) -> None:
        """`phase` (a StepTiming field) ends now: it took the time since the last lap (or the launch)."""
        now = time.perf_counter()
        setattr(self.timing, phase, now - self._last)
        self._last = now

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None and self.timing is not None:
            self.timing.total_s = time.perf_counter() - self._launch
            self._record(self.timing)
