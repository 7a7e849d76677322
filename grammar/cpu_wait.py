"""How long a thread has waited for a CPU: the measure of starvation, which wall time is not (a
thread may take long because it has much to do, or because other work holds every core)."""
from __future__ import annotations


def thread_cpu_wait_s(thread_id: int) -> float:
    """Seconds the thread (by native id) has spent runnable on a run queue, waiting for a CPU:
    Linux's scheduler statistics. 0 elsewhere, or where the kernel does not keep them."""
    try:
        with open(f"/proc/self/task/{thread_id}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
