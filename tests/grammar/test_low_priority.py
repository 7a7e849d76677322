"""The grammar probe thread runs at the lowest CPU priority and hands back results and errors."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from grammar.runtime.low_priority import LOWEST_PRIORITY, run_at_low_priority


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
