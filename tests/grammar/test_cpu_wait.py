"""A thread's wait for a CPU, read from the kernel's scheduler statistics."""
from __future__ import annotations

import threading

from grammar.cpu_wait import thread_cpu_wait_s


def test_a_thread_s_cpu_wait_is_read_and_an_unknown_thread_waited_none():
    assert thread_cpu_wait_s(threading.get_native_id()) >= 0.0
    assert thread_cpu_wait_s(-1) == 0.0
