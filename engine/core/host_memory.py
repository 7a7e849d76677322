"""The engine process's heap: glibc's malloc settings and oneDNN's primitive cache, set when the
engine starts, and the free heap handed back to the kernel now and then.

Why: a serving engine meets a new step shape (rows of a matmul) most steps for minutes, and its
resident memory (RSS) grew with each new one although the Python heap stayed flat:
* glibc's mmap threshold is dynamic: after a large block (a step's logits, a prompt chunk's
  activations) is freed, blocks up to its size come from the heap instead of their own mapping,
  and the heap keeps its high-water mark (free pages stay resident until trimmed);
* oneDNN compiles and keeps a primitive per matmul shape, up to 1,024 of them.
A fixed mmap threshold hands every large block back when it is freed; smaller primitive caches
bound the compiled kernels kept; a trim now and then hands back the free pages a busy engine's
heap would keep. None changes a result, only where memory lives. In a process where torch has
already run a matmul (an in-process LLM made after other torch work) the cache sizes were set then.
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

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
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
        if libc is None or not hasattr(libc, "mallopt") or not libc.mallopt(_M_MMAP_THRESHOLD,
                                                                            config.malloc_mmap_threshold_bytes):
            logger.warning("could not set malloc's mmap threshold (not glibc?); the heap may keep its high-water mark")


class HeapTrimmer:
    """Calls release_free_heap at most once per `interval_s` of the engine's steps (0: never).

    glibc trims the top of a heap by itself, but not free pages below a live block; on a busy
    engine that is never idle this is what hands them back. One trim took about 8 ms here
    (a 2 GiB engine process), against steps of 0.1-0.5 s."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()
        self.num_trims = 0
        self.trim_s = 0.0  # seconds spent trimming, in all

    def maybe_trim(self) -> None:
        if self.interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            release_free_heap()
            self._last = time.monotonic()
            self.num_trims += 1
            self.trim_s += self._last - now
