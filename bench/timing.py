"""Best-of-N timing for the kernel micro-benchmarks.

The machine may be shared and interference only ever adds time, so the fastest repeat is the
closest to the code's own cost. Imports no torch: a caller may need to set torch's ISA first.
"""
from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """Seconds per call of `fn`: the best of `repeats` timings of `calls` back-to-back calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best
