"""A thread at the lowest CPU priority, for grammar work whose cost is not known in advance.

The compile-time fill probe (grammar/xgrammar/backend.py) exists to find grammars whose bitmask
fills take seconds; finding one costs those seconds of CPU. On a machine whose cores the forward
pass's threads already use, that CPU would come out of every running request's step. In Linux's
idle scheduling class the probe runs in the gaps the forward pass leaves, and a heavy grammar
delays only its own compile.
Time limits on this work are measured in the thread's CPU time, which priority does not change.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

logger = logging.getLogger(__name__)

LOWEST_PRIORITY = 19  # the highest nice value Linux allows

T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def run_at_low_priority(fn: Callable[..., T], *args) -> T:
    """fn(*args) on the shared low-priority thread; blocks until it returns (or raises)."""
    return _shared_pool().submit(fn, *args).result()


def lower_current_thread_priority() -> bool:
    """Put the calling thread in Linux's SCHED_IDLE class (it runs only when no normal thread
    wants the core, and yields the moment one wakes: a nice value alone still delays the forward
    pass's threads at each of their many wake-ups) at nice 19. Linux keeps both per thread; any
    user may lower them. False where the platform cannot, in which case nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(LOWEST_PRIORITY, os.getpriority(os.PRIO_PROCESS, tid)))
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (OSError, AttributeError) as e:
        logger.warning("could not lower the grammar probe thread's priority: %s", e)
        return False


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-probe", initializer=lower_current_thread_priority)
        return _pool
