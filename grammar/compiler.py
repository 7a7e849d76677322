"""Asynchronous, cached, time-limited grammar compilation: one GrammarCompiler per engine.

The engine thread calls `submit` when a constrained request arrives and polls the returned
future each step (the request waits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR meanwhile); the
front end calls `compile_sync` to validate a constraint ahead of traffic. Both share one cache.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from grammar.backend import CompiledGrammar, GrammarBackend, GrammarError
from grammar.compile_limit import CompileRuns, LimitTimer, WithWorkerWaits
from grammar.cpu_wait import thread_cpu_wait_s
from grammar.json_schema.limits import check_limits
from grammar.runtime.low_priority import IdleClassPool
from grammar.schema_worker import SchemaWorker

if TYPE_CHECKING:
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint

logger = logging.getLogger(__name__)

# what a cached failure costs besides its message (the exception object, the cache slot)
_FAILURE_OVERHEAD_BYTES = 256
# compile times kept for a reader (the engine's metrics) that has not taken them yet
_MAX_UNREAD_COMPILE_TIMES = 4096


class GrammarCompiler:
    """Compiles constraints on a thread pool, caching results by `Constraint.cache_key`.

    * The cache is an LRU bounded in bytes (CompiledGrammar.num_bytes plus the key's spec
      text). A grammar larger than the whole cache is returned but not kept.
    * Failures are cached too, so a bad schema sent a thousand times is compiled once.
    * Identical constraints submitted while one is compiling share its future.
    * A compile that runs past `compile_timeout_s` (counted from when a pool thread starts
      it, not from submission, less the time its thread waited for a CPU that other work held:
      a machine saturated by other processes slows a compile, it does not make the constraint
      too complex) resolves its future with a GrammarError. Python cannot stop the
      thread, so the compile runs on: while it does, the timeout is what the cache holds (so
      duplicates fail fast instead of queueing more runaway compiles), and when it finishes its
      outcome replaces the timeout in the cache, so the work is not wasted on the next request.
      Meanwhile it occupies a pool thread; compiles queued behind it wait.
    * The compile itself runs in Linux's idle scheduling class (GrammarConfig.idle_compiles;
      grammar/runtime/low_priority.py): a schema that takes seconds to compile takes them from
      the gaps the forward pass leaves, not from the requests already generating. A compile kept
      from a CPU for STARVED_AFTER_S is rescued at normal priority, so it is never starved.
    * The pure-Python part of a large JSON schema's compile (the rewrite, the grammar's bounds) runs
      in a worker process (GrammarConfig.schema_worker; grammar/schema_worker.py), also in the
      idle class: in this process it would hold the GIL the engine thread needs.

    Thread-safe: any thread may submit; futures are resolved on pool or timer threads and never
    change state afterwards. Futures cannot be cancelled (several requests may share one).
    """

    def __init__(self, backend: GrammarBackend, config: GrammarConfig | None = None,
                 cpu_wait_s: Callable[[int], float] | None = None) -> None:
        """`cpu_wait_s`: a thread's time so far waiting for a CPU (by native id); Linux's
        scheduler statistics unless given."""
        if config is None:
            from grammar.config import GrammarConfig

            config = GrammarConfig()
        self.backend = backend
        self.config = config
        num_threads = max(1, config.num_compile_threads)
        # each compile's own thread: it waits for the compile (rescuing it if starved) and keeps its limits
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="grammar-compile")
        # where the compiles run: a compile has no state another run of it could race on
        self._idle = (IdleClassPool(num_threads, thread_name_prefix="grammar-compile-idle", restartable=True,
                                    cpu_wait_s=cpu_wait_s or thread_cpu_wait_s)
                      if config.idle_compiles else None)
        # the pure-Python part of a large schema's compile, in a process of its own: it holds no
        # GIL the engine thread needs (grammar/schema_worker.py)
        self._schema_worker = SchemaWorker() if config.schema_worker else None
        own_wait_s = cpu_wait_s or thread_cpu_wait_s
        if self._schema_worker is not None:
            backend.use_schema_runner(self._schema_worker.run)
            # a compile's limit excuses the worker's waits for a CPU as it does its own thread's
            own_wait_s = WithWorkerWaits(own_wait_s, self._schema_worker)
        self._lock = threading.Lock()  # guards everything below
        self._cache: OrderedDict[tuple, tuple[CompiledGrammar | GrammarError, int]] = OrderedDict()
        self._cache_bytes = 0
        self._in_flight: dict[tuple, Future[CompiledGrammar]] = {}
        self.num_hits = 0
        self.num_misses = 0
        self.num_timeouts = 0
        self.num_evictions = 0  # cache entries dropped to stay within cache_bytes
        # backend -> why its constraints failed ("timeout", "limit", "invalid", "out_of_memory",
        # "internal") -> how many; a failure's backend is the one the constraint asked for
        self.failures: dict[str, dict[str, int]] = {}
        # (backend, seconds) of each finished compile, until taken: the backend that compiled it,
        # or the one asked for ("auto" included) when it failed
        self._compile_times: list[tuple[str, float]] = []
        self._cpu_wait_s = own_wait_s

    def submit(self, constraint: Constraint) -> Future[CompiledGrammar]:
        """A future of the compiled grammar; already done on a cache hit. Never raises: every
        problem (limits, a bad spec, a timeout) arrives as the future's GrammarError."""
        return self._submit(constraint)[0]

    def compile_sync(self, constraint: Constraint) -> tuple[CompiledGrammar, float, bool]:
        """Compile (or fetch) now: (grammar, seconds spent, whether it came from the cache).

        Raises GrammarError. Blocks the calling thread, at most about compile_timeout_s.
        """
        start = time.monotonic()
        future, cached = self._submit(constraint)
        compiled = future.result()
        return compiled, time.monotonic() - start, cached

    def take_compile_times(self) -> list[tuple[str, float]]:
        """(backend, seconds) of each compile (pool time, successful or not) since the last call."""
        with self._lock:
            times, self._compile_times = self._compile_times, []
        return times

    @property
    def cache_bytes(self) -> int:
        with self._lock:
            return self._cache_bytes

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    def shutdown(self) -> None:
        """Stop compiling: queued compiles are dropped and their futures fail; running ones
        finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._idle is not None:
            self._idle.shutdown(wait=False, cancel_futures=True)
        if self._schema_worker is not None:
            self._schema_worker.shutdown()
        with self._lock:
            pending = list(self._in_flight.values())
            self._in_flight.clear()
        for future in pending:
            _resolve(future, GrammarError("the grammar compiler was shut down"))

    # -- internals ------------------------------------------------------------------------

    def _submit(self, constraint: Constraint) -> tuple[Future[CompiledGrammar], bool]:
        # the size limit first: cache_key parses the spec, and an oversized one should not be
        spec_bytes = len(constraint.spec) + sum(len(c) for c in constraint.choices)
        if spec_bytes > self.config.max_spec_bytes:  # chars <= bytes; the exact check runs later
            self._count_failure(constraint, "limit")
            return _failed(GrammarError(
                f"{constraint.kind} spec is over the max_spec_bytes limit of {self.config.max_spec_bytes} "
                f"({spec_bytes} characters)")), False
        try:
            key = constraint.cache_key
        except ValueError as e:  # json.JSONDecodeError, or a RecursionError-free parse failure
            self._count_failure(constraint, "invalid")
            return _failed(GrammarError(f"{constraint.kind} spec is not valid: {e}")), False
        except RecursionError:
            self._count_failure(constraint, "limit")
            return _failed(GrammarError("json_schema is nested too deeply to parse")), False
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.num_hits += 1
                if isinstance(entry[0], CompiledGrammar) and entry[0].lazy_masks:
                    self._store(key, constraint, entry[0])  # counted again: its masks grew in use
                return _done(entry[0]), True
            future = self._in_flight.get(key)
            if future is not None:
                return future, False
            self.num_misses += 1
            future = Future()
            future.set_running_or_notify_cancel()  # shared by requests: nobody may cancel it
            self._in_flight[key] = future
        self._pool.submit(self._run, key, constraint, future)
        return future, False

    def _run(self, key: tuple, constraint: Constraint, future: Future[CompiledGrammar]) -> None:
        timeout_s = self.config.compile_timeout_s
        timer = None
        start = time.monotonic()
        runs = CompileRuns(self._cpu_wait_s)
        if timeout_s and timeout_s > 0:
            timer = LimitTimer(timeout_s, runs.own_s, lambda: self._expire(key, constraint, future))
        outcome: CompiledGrammar | GrammarError
        failure = None  # the reason, for the failure counts
        try:
            failure = "limit"
            check_limits(constraint, self.config.max_spec_bytes, self.config.max_schema_depth)
            if constraint.think is not None:
                check_limits(constraint.think, self.config.max_spec_bytes, self.config.max_schema_depth)
            failure = "invalid"
            if self._idle is None:
                outcome = runs.run(self.backend.compile, constraint)
            else:
                outcome = self._idle.result(self._idle.submit(runs.run, self.backend.compile, constraint))
            failure = None
        except GrammarError as e:
            outcome = e
        except MemoryError:  # this constraint's compile ran out of memory: its own failure
            failure = "out_of_memory"
            logger.warning("%s compile ran out of memory", constraint.kind)
            outcome = GrammarError(f"{constraint.kind} could not be compiled: out of memory; simplify the constraint")
        except Exception as e:  # a backend bug must not strand the request
            failure = "internal"
            logger.exception("grammar backend failed on a %s constraint", constraint.kind)
            outcome = GrammarError(f"{constraint.kind} could not be compiled: internal error {type(e).__name__}: {e}")
        finally:
            if timer is not None:
                timer.cancel()
        elapsed = time.monotonic() - start
        if timeout_s and elapsed > timeout_s:
            logger.warning("%s compile finished after %.1f s, past its %.1f s limit; caching its outcome",
                           constraint.kind, elapsed, timeout_s)
        backend = outcome.backend_name if isinstance(outcome, CompiledGrammar) else ""
        backend = backend or self._asked_backend(constraint)
        with self._lock:
            if len(self._compile_times) < _MAX_UNREAD_COMPILE_TIMES:
                self._compile_times.append((backend, elapsed))
            if self._in_flight.get(key) is future:
                del self._in_flight[key]
                if failure is not None:  # an expired compile was counted as a timeout already
                    self._add_failure(backend, failure)
            self._store(key, constraint, outcome)
        _resolve(future, outcome)

    def _expire(self, key: tuple, constraint: Constraint, future: Future[CompiledGrammar]) -> None:
        error = GrammarError(f"{constraint.kind} compile exceeded the {self.config.compile_timeout_s:.1f} s "
                             "limit (compile_timeout_s); simplify the constraint")
        with self._lock:
            if self._in_flight.get(key) is not future:
                return  # finished meanwhile
            del self._in_flight[key]
            self.num_timeouts += 1
            self._add_failure(self._asked_backend(constraint), "timeout")
            self._store(key, constraint, error)
        _resolve(future, error)

    def _store(self, key: tuple, constraint: Constraint, outcome: CompiledGrammar | GrammarError) -> None:
        """Insert or replace under the lock, then evict least recently used entries."""
        key_bytes = len(constraint.spec) + sum(len(c) for c in constraint.choices)
        if isinstance(outcome, GrammarError):
            num_bytes = key_bytes + len(str(outcome)) + _FAILURE_OVERHEAD_BYTES
        else:
            num_bytes = key_bytes + outcome.num_bytes
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_bytes -= old[1]
        if num_bytes > self.config.cache_bytes:
            return
        self._cache[key] = (outcome, num_bytes)
        self._cache_bytes += num_bytes
        while self._cache_bytes > self.config.cache_bytes:
            _, (_, evicted_bytes) = self._cache.popitem(last=False)
            self._cache_bytes -= evicted_bytes
            self.num_evictions += 1

    def _count_failure(self, constraint: Constraint, reason: str) -> None:
        with self._lock:
            self._add_failure(self._asked_backend(constraint), reason)

    def _add_failure(self, backend: str, reason: str) -> None:
        """Under the lock."""
        counts = self.failures.setdefault(backend, {})
        counts[reason] = counts.get(reason, 0) + 1

    def _asked_backend(self, constraint: Constraint) -> str:
        return constraint.grammar_backend or self.config.grammar_backend


def _done(outcome: CompiledGrammar | GrammarError) -> Future[CompiledGrammar]:
    future: Future[CompiledGrammar] = Future()
    future.set_running_or_notify_cancel()
    _resolve(future, outcome)
    return future


def _failed(error: GrammarError) -> Future[CompiledGrammar]:
    return _done(error)


def _resolve(future: Future[CompiledGrammar], outcome: CompiledGrammar | GrammarError) -> None:
    """Resolve once; the loser of a compile/timeout race is ignored."""
    try:
        if isinstance(outcome, GrammarError):
            # a fresh exception per future: a shared one would collect every raiser's traceback
            future.set_exception(GrammarError(str(outcome)))
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass
