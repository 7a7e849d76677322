"""The engine process's heap: glibc's malloc settings and oneDNN's primitive cache, set when the
engine starts, and the free heap handed back to the kernel now and then.

Why: a serving engine meets a new step shape (rows of a matmul) most steps for minutes, and its
resident memory (RSS) grew with each new one although the Python heap stayed flat:
* glibc's heap keeps its high-water mark: free pages below a live block stay resident until
  trimmed, and its dynamic mmap threshold moves with the largest block freed;
* oneDNN compiles and keeps a primitive per matmul shape, up to 1,024 of them.
So the thresholds are fixed, smaller primitive caches bound the compiled kernels kept, and the
heap's free pages are handed back now and then while the engine is busy and whenever it goes
idle. The mmap threshold is high on purpose: every block above it is a fresh mapping whose pages
the kernel zeroes on first touch, and a step's activations and logits are such blocks every step
(a 1 MiB threshold cost 1.8-2.9 M page faults and 17-20 % of a batch-64 run's time here). Below it
they are reused from the heap, which the trims keep from holding more than the steps need. None
changes a result, only where memory lives. In a process where torch has already run a matmul (an
in-process LLM made after other torch work) the cache sizes were set then.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import HostMemoryConfig

logger = logging.getLogger(__name__)

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# the two caches of compiled oneDNN primitives, each sized once from its variable when first used:
# oneDNN's own, and the one torch's oneDNN wrapper (ideep) keeps in front of it
ONEDNN_CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc keeps them otherwise, and RSS with them)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def configure_host_memory(config: HostMemoryConfig) -> None:
    """Apply `config` to this process. Call before torch runs its first matmul: the primitive
    caches read their capacity once. A variable the user set already wins over the config."""
    if config.onednn_primitive_cache_capacity is not None:
        for name in ONEDNN_CACHE_ENVS:
            os.environ.setdefault(name, str(config.onednn_primitive_cache_capacity))
    if config.malloc_mmap_threshold_bytes is not None:
        libc = _libc()
        threshold = config.malloc_mmap_threshold_bytes
        # free() trims the heap's top past the trim threshold, which a fixed mmap threshold leaves at
        # glibc's 128 KiB: every step would hand its activations back and fault them in again. Twice
        # the mmap threshold is glibc's own rule while its threshold is dynamic.
        if libc is None or not hasattr(libc, "mallopt") or not (libc.mallopt(_M_MMAP_THRESHOLD, threshold)
                                                                and libc.mallopt(_M_TRIM_THRESHOLD, 2 * threshold)):
            logger.warning("could not set malloc's mmap threshold (not glibc?); the heap may keep its high-water mark")


class HeapTrimmer:
    """Calls release_free_heap at most once per `interval_s` of the engine's steps, and once when
    the engine goes idle after steps (0: never).

    glibc trims the top of a heap by itself, but not free pages below a live block; on a busy
    engine that is never idle this is what hands them back. One trim took about 8 ms here
    (a 2 GiB engine process), against steps of 0.1-0.5 s."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()
        self._stepped = False  # a step ran since the last trim
        self.num_trims = 0
        self.trim_s = 0.0  # seconds spent trimming, in all

    def maybe_trim(self) -> None:
        """After a step."""
        self._stepped = True
        if self.interval_s > 0 and time.monotonic() - self._last >= self.interval_s:
            self._trim()

    def on_idle(self) -> None:
        """Nothing left to run: the heap holds what the last steps used, and nothing needs it now.
        Called after their outputs went out, so no answer waits for the trim."""
        if self.interval_s > 0 and self._stepped:
            self._trim()

    def _trim(self) -> None:
        start = time.monotonic()
        release_free_heap()
        self._last = time.monotonic()
        self._stepped = False
        self.num_trims += 1
        self.trim_s += self._last - start
