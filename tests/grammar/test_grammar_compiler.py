"""GrammarCompiler: cache hits, cached failures, time limit, LRU by bytes, thread safety.

A fake backend stands in for xgrammar, so these tests control time and size exactly.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from grammar_fakes import FakeBackend, FakeCompiled

from grammar.backend import GrammarError
from grammar.compiler import GrammarCompiler
from grammar.config import GrammarConfig
from grammar.constraint import Constraint


def make_compiler(backend: FakeBackend | None = None, **config) -> tuple[GrammarCompiler, FakeBackend]:
    backend = backend or FakeBackend()
    return GrammarCompiler(backend, GrammarConfig(**config)), backend


def regex(spec: str) -> Constraint:
    return Constraint("regex", spec)


def test_cache_hit_returns_a_done_future_and_compiles_once():
    compiler, backend = make_compiler(FakeBackend(compile_s=0.05))
    first = compiler.submit(regex("a+"))
    assert isinstance(first.result(timeout=5), FakeCompiled)
    second = compiler.submit(regex("a+"))
    assert second.done() and second.result().spec == "a+"
    compiled, compile_s, cached = compiler.compile_sync(regex("a+"))
    assert cached and compiled.spec == "a+"
    assert backend.calls == ["a+"]  # one compile: the hits never reached the backend
    assert (compiler.num_hits, compiler.num_misses) == (2, 1)


def test_compile_sync_reports_a_miss_and_its_time():
    compiler, _ = make_compiler(FakeBackend(compile_s=0.05))
    _, compile_s, cached = compiler.compile_sync(regex("b+"))
    assert not cached and compile_s >= 0.05


def test_identical_submits_while_compiling_share_one_compile():
    compiler, backend = make_compiler()
    futures = [compiler.submit(regex("slow")) for _ in range(3)]
    assert futures[0] is futures[1] is futures[2]
    assert not futures[0].cancel()  # shared: nobody may cancel it for the others
    backend.gate.set()
    assert futures[0].result(timeout=5).spec == "slow"
    assert backend.calls == ["slow"]


def test_failures_are_cached_as_failures():
    compiler, backend = make_compiler()
    with pytest.raises(GrammarError, match="bad-1") as first:
        compiler.submit(regex("bad-1")).result(timeout=5)
    again = compiler.submit(regex("bad-1"))
    assert again.done()
    with pytest.raises(GrammarError, match="bad-1") as second:
        again.result()
    assert first.value is not second.value  # a fresh exception per request
    assert backend.calls == ["bad-1"]


def test_a_compile_over_the_time_limit_fails_and_its_late_result_is_kept():
    compiler, backend = make_compiler(compile_timeout_s=0.2)
    future = compiler.submit(regex("slow"))
    # the backend is blocked until released below: any answer now is the time limit's
    with pytest.raises(GrammarError, match=r"regex compile exceeded the 0.2 s limit"):
        future.result(timeout=5)
    # while the runaway compile still runs, duplicates fail fast instead of queueing
    duplicate = compiler.submit(regex("slow"))
    assert duplicate.done() and isinstance(duplicate.exception(), GrammarError)
    assert compiler.num_timeouts == 1
    backend.gate.set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the thread finishes and replaces the timeout in the cache
        late = compiler.submit(regex("slow"))
        if late.exception() is None:
            break
        time.sleep(0.02)
    assert late.result().spec == "slow"
    assert backend.calls == ["slow"]


def test_time_the_compile_waited_for_a_cpu_does_not_count_against_its_limit():
    backend = FakeBackend()
    # as if other processes held the CPU for all of the compile's wall time: it has used none of its limit
    compiler = GrammarCompiler(backend, GrammarConfig(compile_timeout_s=0.1),
                               cpu_wait_s=lambda thread_id: time.monotonic())
    future = compiler.submit(regex("slow"))
    with pytest.raises(FutureTimeout):
        future.result(timeout=1)  # ten limits of wall time: not expired
    backend.gate.set()
    assert future.result(timeout=5).spec == "slow"
    assert compiler.num_timeouts == 0


def test_the_time_limit_counts_from_the_start_of_the_compile_not_the_queue():
    # each compile takes 0.1 s, a fifth of the limit; the last of 8 on one thread waits at least 0.7 s in the queue
    compiler, backend = make_compiler(FakeBackend(compile_s=0.1), compile_timeout_s=0.5, num_compile_threads=1)
    futures = [compiler.submit(regex(f"q{i}")) for i in range(8)]
    assert all(isinstance(f.result(timeout=5), FakeCompiled) for f in futures)


def test_lru_is_bounded_in_bytes():
    compiler, backend = make_compiler(cache_bytes=1000)
    key_bytes = len("size:400")
    for spec in ("size:400", "size:401"):
        compiler.compile_sync(regex(spec))
    assert compiler.cache_bytes == 400 + 401 + 2 * key_bytes
    compiler.compile_sync(regex("size:400"))  # touch: now size:401 is the least recently used
    compiler.compile_sync(regex("size:402"))
    assert compiler.num_cached == 2 and compiler.cache_bytes <= 1000
    assert compiler.compile_sync(regex("size:400"))[2]  # still cached
    assert not compiler.compile_sync(regex("size:401"))[2]  # was evicted, compiled again
    assert backend.calls.count("size:401") == 2


def test_a_grammar_larger_than_the_cache_is_returned_but_not_kept():
    compiler, backend = make_compiler(cache_bytes=1000)
    compiler.compile_sync(regex("size:100"))
    compiled, _, cached = compiler.compile_sync(regex("size:5000"))
    assert compiled.num_bytes == 5000 and not cached
    assert compiler.num_cached == 1
    assert not compiler.compile_sync(regex("size:5000"))[2]


def test_a_lazily_built_grammar_is_counted_again_on_each_hit_as_its_masks_grow():
    compiler, _ = make_compiler(cache_bytes=1000)
    key_bytes = len("size:100")
    lazy, _, _ = compiler.compile_sync(regex("size:100"))
    lazy.lazy_masks = True
    compiler.compile_sync(regex("size:300"))
    assert compiler.cache_bytes == 100 + 300 + 2 * key_bytes
    lazy.num_bytes = 600  # requests built masks
    assert compiler.compile_sync(regex("size:100"))[2]  # a hit: counted again
    assert compiler.cache_bytes == 600 + 300 + 2 * key_bytes
    lazy.num_bytes = 800  # now over the budget beside size:300, the least recently used
    assert compiler.compile_sync(regex("size:100"))[2]
    assert compiler.num_cached == 1 and compiler.cache_bytes == 800 + key_bytes


def test_concurrent_submits_from_many_threads_compile_once():
    compiler, backend = make_compiler(FakeBackend(compile_s=0.05), num_compile_threads=2)
    results: list[object] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(compiler.submit(regex("shared")).result(timeout=5))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert backend.calls == ["shared"]


def test_a_backend_crash_becomes_a_grammar_error():
    compiler, _ = make_compiler()
    with pytest.raises(GrammarError, match="internal error KeyError"):
        compiler.compile_sync(regex("crash"))


def test_shutdown_fails_queued_compiles():
    compiler, backend = make_compiler(num_compile_threads=1)
    running = compiler.submit(regex("slow"))
    queued = compiler.submit(regex("queued"))
    compiler.shutdown()
    with pytest.raises(GrammarError, match="shut down"):
        queued.result(timeout=5)
    backend.gate.set()
    running.exception(timeout=5)  # resolved one way or the other, never left hanging


class _NamingBackend(FakeBackend):
    """Names each grammar it compiles, as the selecting backend does."""

    def compile(self, constraint: Constraint) -> FakeCompiled:
        compiled = super().compile(constraint)
        compiled.backend_name = "llguidance"
        return compiled


def test_compile_times_and_failures_name_their_backend():
    compiler, _ = make_compiler(_NamingBackend(), max_spec_bytes=64, grammar_backend="xgrammar")
    compiler.submit(regex("a+")).result(timeout=5)
    with pytest.raises(GrammarError):
        compiler.submit(Constraint("regex", "bad-1", grammar_backend="auto")).result(timeout=5)
    with pytest.raises(GrammarError, match="max_spec_bytes"):
        compiler.submit(regex("a" * 65)).result(timeout=5)
    # a compiled grammar's own backend; a failure's, the one asked for (else the server's default)
    assert [backend for backend, _ in compiler.take_compile_times()] == ["llguidance", "auto"]
    assert compiler.failures == {"auto": {"invalid": 1}, "xgrammar": {"limit": 1}}


def test_a_think_constraint_is_held_to_the_same_limits():
    compiler, backend = make_compiler(max_spec_bytes=64, max_schema_depth=3)
    big = Constraint("regex", "a", think_end="</think>", think=regex("b" * 65))
    with pytest.raises(GrammarError, match="max_spec_bytes"):
        compiler.submit(big).result(timeout=5)
    deep = Constraint("regex", "a", think_end="</think>",
                      think=Constraint("json_schema", '{"items": {"items": {"items": {"items": {}}}}}'))
    with pytest.raises(GrammarError, match="max_schema_depth"):
        compiler.submit(deep).result(timeout=5)
    assert backend.calls == []  # refused before the backend saw them


class _SchedulingBackend(FakeBackend):
    """Records the scheduling class of the thread each compile runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.policies: list[int] = []

    def compile(self, constraint):
        self.policies.append(os.sched_getscheduler(0))
        return super().compile(constraint)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's idle scheduling class")
def test_compiles_run_in_the_idle_class_unless_switched_off():
    idle = _SchedulingBackend()
    make_compiler(idle)[0].compile_sync(regex("a"))
    normal = _SchedulingBackend()
    make_compiler(normal, idle_compiles=False)[0].compile_sync(regex("a"))
    assert idle.policies == [os.SCHED_IDLE] and normal.policies == [os.SCHED_OTHER]


def test_a_starved_compile_still_finishes_and_its_limit_counts_only_its_own_time():
    backend = FakeBackend()
    # every thread as if starved from the start: the compile is rescued (restored or run again)
    compiler = GrammarCompiler(backend, GrammarConfig(compile_timeout_s=0.2),
                               cpu_wait_s=lambda thread_id: time.monotonic())
    future = compiler.submit(regex("slow"))
    time.sleep(1.2)  # two starvation checks: a rescue, and still no time of its own spent
    backend.gate.set()
    assert future.result(timeout=5).spec == "slow"
    assert compiler.num_timeouts == 0
