"""The step's timing (engine/core/step_timer.py): one record per step that launched a forward, its
wall time with whatever the machine made it wait, and its busy time (the speculator's price of a
row) without: what the step's threads ran, the fill beside the forward counted once."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from engine.core.step_timer import StepTimer, StepTiming

PLAN = SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 3}, total_num_scheduled_tokens=4,
                       structured_output_request_ids={"b": 0})


def spin(cpu_s: float) -> None:
    """Run on this thread's CPU for `cpu_s` seconds of its CPU time."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_time_off_the_cpu_is_wall_time_and_not_busy_time():
    records: list[StepTiming] = []
    with StepTimer(records.append) as timer:
        timer.launched(PLAN)
        spin(0.02)  # the fill
        timer.filled()
        time.sleep(0.15)  # off the CPU, as a thread that another process holds back
        timer.waited()
        timer.sampled()
    [timing] = records
    assert (timing.num_reqs, timing.num_tokens, timing.num_bitmask_rows) == (2, 4, 1)
    assert timing.fill_cpu_s >= 0.02 and timing.fill_s >= 0.02 and timing.wait_s >= 0.15
    assert timing.wall_s >= timing.total_s >= 0.17
    assert 0.02 <= timing.busy_s < 0.1  # the forward's CPU time is the runner's: none here


def test_the_fill_beside_the_forward_counts_once_the_longer_of_the_two():
    timing = StepTiming(num_reqs=1, num_tokens=1, num_bitmask_rows=1, schedule_s=0.001,
                        engine_cpu_s=0.010, fill_cpu_s=0.004, forward_cpu_s=0.020)
    assert timing.busy_s == pytest.approx(0.006 + 0.020)
    timing.fill_cpu_s, timing.engine_cpu_s = 0.030, 0.036  # a fill longer than the forward
    assert timing.busy_s == pytest.approx(0.006 + 0.030)


def test_a_step_without_a_forward_or_that_raised_records_nothing():
    records: list[StepTiming] = []
    with StepTimer(records.append):
        pass  # nothing was scheduled
    with pytest.raises(RuntimeError), StepTimer(records.append) as timer:
        timer.launched(PLAN)
        raise RuntimeError("the step failed")
    assert records == []
