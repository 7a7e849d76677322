"""The engine process's own memory ceiling: a thread that watches its resident memory (RSS).

    RSS > soft limit   the engine refuses new requests (the front end answers RESOURCE_EXHAUSTED),
                       fails the requests whose grammar is still compiling, and hands freed heap
                       back to the kernel; below the soft limit again, it accepts again. Still over
                       it once the running requests have drained: it exits for a fresh process.
    RSS > hard limit   last words to the front end, then exit with EXIT_MEMORY_CEILING at once;
                       the front end's supervisor restarts the engine.

Why a watchdog on RSS rather than RLIMIT_AS: measured on the engine process (SmolLM2-135M, 2 torch
threads), the address space was 0.76 GiB larger than the resident memory idle and 0.88 GiB under
load, and the gap grows with threads (glibc reserves a 64 MiB heap arena per thread) and with
mmap'd files; on CUDA the driver maps far more address space than memory. A limit on the address
space is therefore a limit on a number only loosely tied to memory, and the bad_alloc it causes
lands in whichever allocation comes next (often the forward pass), not in the runaway one.
Work stuck inside one native call (a step that never returns) only the hard limit stops.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

EXIT_MEMORY_CEILING = 3  # the engine process's exit code when it stops itself over its memory ceiling
DEFAULT_FRACTION_OF_MEMORY = 0.8  # the default hard limit: this share of the machine's (or cgroup's) memory

_GIB = 1 << 30


@dataclass(frozen=True)
class MemoryLimit:
    hard_bytes: int  # RSS past which the engine process exits at once
    soft_fraction: float = 0.9  # the soft limit, as a fraction of the hard one
    interval_s: float = 0.05  # between two RSS samples (a 0.5 GB/s runaway grows 25 MB in one)

    def __post_init__(self) -> None:
        if self.hard_bytes < 1:
            raise ValueError(f"the engine memory limit must be > 0 bytes, got {self.hard_bytes}")
        if not 0 < self.soft_fraction <= 1:
            raise ValueError(f"soft_fraction must be in (0, 1], got {self.soft_fraction}")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")

    @property
    def soft_bytes(self) -> int:
        return int(self.hard_bytes * self.soft_fraction)


def machine_memory_bytes() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit if that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_memory_limit() -> MemoryLimit:
    return MemoryLimit(hard_bytes=int(machine_memory_bytes() * DEFAULT_FRACTION_OF_MEMORY))


def rss_bytes() -> int:
    """This process's resident memory (one read of /proc/self/statm, about 10 us)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def format_gib(num_bytes: int) -> str:
    return f"{num_bytes / _GIB:.2f} GiB"


class MemoryWatchdog:
    """Samples RSS every `limit.interval_s` on a daemon thread and reports crossings.

    `on_pressure(True, rss)` when RSS rises past the soft limit, `on_pressure(False, rss)` when it
    falls below again (each once per crossing); `on_hard_limit(rss)` when it passes the hard limit,
    after which the watchdog stops (the callback is expected to end the process). Callbacks run on
    the watchdog's thread.
    """

    def __init__(self, limit: MemoryLimit, on_pressure: Callable[[bool, int], None],
                 on_hard_limit: Callable[[int], None], read_rss: Callable[[], int] = rss_bytes) -> None:
        self.limit = limit
        self._on_pressure = on_pressure
        self._on_hard_limit = on_hard_limit
        self._read_rss = read_rss
        self.over_soft_limit = False
        self.peak_rss_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="formwork-memory-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """Take one sample and report a crossing; False once the hard limit was passed."""
        rss = self._read_rss()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if rss > self.limit.hard_bytes:
            self._on_hard_limit(rss)
            return False
        over = rss > self.limit.soft_bytes
        if over != self.over_soft_limit:
            self.over_soft_limit = over
            self._on_pressure(over, rss)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.limit.interval_s):
            try:
                if not self.check():
                    return
            except Exception:  # a watchdog that dies silently would leave the engine unguarded
                logger.exception("memory watchdog: sampling failed; the engine has no memory ceiling now")
                return
