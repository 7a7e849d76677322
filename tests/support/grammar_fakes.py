"""Grammar stand-ins for the tests that need the engine's side of the grammar contract without
xgrammar, so that they control time, size, failures and every token exactly.

One backend, FakeBackend, whose spec says what a compile does; its matchers are AnyTokenGrammar
(allows every token; its fills can be slow, held back or raise) or ScriptedGrammar (keeps what it
accepted, and follows a script of forbidden, ending and forced tokens). SearchCountingGrammar wraps
a real matcher to count its closing searches.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import torch

from grammar.backend import CompiledGrammar, Grammar, GrammarBackend, GrammarError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from grammar.constraint import Constraint

GATE_TIMEOUT_S = 30  # a test that never opens a gate fails after this, instead of hanging

# the work a matcher can be made to fail in, and what it raises there: xgrammar's std::bad_alloc
# surfaces as Python's MemoryError or as a RuntimeError from C++
BAD_ALLOC_IN = {"make": MemoryError, "fill": MemoryError, "accept": RuntimeError, "jump_forward": RuntimeError}


class FakeCompiled(CompiledGrammar):
    """A compiled constraint that keeps its spec. `num_bytes` may be set: a lazily compiled
    grammar's size grows as requests build its masks."""

    num_bytes = 64  # a plain attribute over the abstract property, so that a test can set it

    def __init__(self, spec: str = "", num_bytes: int = 64) -> None:
        self.spec = spec
        self.num_bytes = num_bytes


class AnyTokenGrammar(Grammar):
    """Allows every token, forces nothing, never ends. Counts its fills and the threads they ran
    on (thread name -> its scheduling policy, None off Linux).

    `lazy_masks`: as a lazily compiled grammar's, its slow fills count against
    lazy_fill_budget_ms; `first_fill_gate`: the first fill waits until the test sets it (a state
    whose mask is being built); `fill_cpu_s`: each fill burns that much of its thread's CPU time
    (the fill limits count CPU, not wall time); `bad_alloc_in`: the work that raises (a key of
    BAD_ALLOC_IN; "make": the backend's make_grammar)."""

    def __init__(self, *, lazy_masks: bool = False, first_fill_gate: threading.Event | None = None,
                 fill_cpu_s: float = 0.0, bad_alloc_in: str | None = None) -> None:
        if bad_alloc_in is not None and bad_alloc_in not in BAD_ALLOC_IN:
            raise ValueError(f"bad_alloc_in must be one of {sorted(BAD_ALLOC_IN)}, not {bad_alloc_in!r}")
        self.lazy_masks = lazy_masks
        self.first_fill_gate = first_fill_gate
        self.fill_cpu_s = fill_cpu_s
        self.bad_alloc_in = bad_alloc_in
        self.num_fills = 0
        self.fill_policies: dict[str, int | None] = {}
        self._raise_if_failing_in("make")

    def _raise_if_failing_in(self, work: str) -> None:
        if self.bad_alloc_in == work:
            raise BAD_ALLOC_IN[work]("std::bad_alloc")

    def fill_bitmask(self, bitmask, row):
        self._raise_if_failing_in("fill")
        linux = sys.platform.startswith("linux")
        self.fill_policies[threading.current_thread().name] = os.sched_getscheduler(0) if linux else None
        if self.num_fills == 0 and self.first_fill_gate is not None:
            if not self.first_fill_gate.wait(GATE_TIMEOUT_S):
                raise TimeoutError("the test never opened the first fill's gate")
        end = time.thread_time() + self.fill_cpu_s
        while time.thread_time() < end:
            pass
        self.num_fills += 1
        bitmask[row] = -1

    def accept_tokens(self, token_ids):
        self._raise_if_failing_in("accept")
        return True

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False

    def jump_forward_token_ids(self):
        self._raise_if_failing_in("jump_forward")
        return []


class ScriptedGrammar(AnyTokenGrammar):
    """Allows every token but `forbidden`; a token in `terminal` ends the output (nothing is
    accepted after it). Forced text: `runs[i]` after the i-th accept_tokens call, and once the runs
    are used up `forcing[t]` after a token t. Keeps the accepted tokens (`accepted`), so rollback is
    real; `rolled_back` lists each rollback's count."""

    def __init__(self, *, forbidden: Iterable[int] = (), terminal: Iterable[int] = (),
                 runs: Iterable[Iterable[int]] = (), forcing: dict[int, list[int]] | None = None) -> None:
        super().__init__()
        self.forbidden, self.terminal = set(forbidden), set(terminal)
        self.runs = [list(run) for run in runs]  # a copy: each grammar follows the script from its start
        self.forcing = dict(forcing or {})
        self.accepted: list[int] = []
        self.rolled_back: list[int] = []
        self._run_next: list[int] = []

    def fill_bitmask(self, bitmask, row):
        super().fill_bitmask(bitmask, row)
        words = bitmask[row].numpy().view("uint32")
        for token_id in self.forbidden:
            words[token_id >> 5] &= ~(1 << (token_id & 31)) & 0xFFFFFFFF

    def accept_tokens(self, token_ids):
        if self.is_terminated() or any(t in self.forbidden for t in token_ids):
            return False
        self.accepted += token_ids
        self._run_next = self.runs.pop(0) if self.runs else []
        return True

    def rollback(self, num_tokens):
        self.rolled_back.append(num_tokens)
        del self.accepted[len(self.accepted) - num_tokens:]

    def is_terminated(self):
        return bool(self.accepted) and self.accepted[-1] in self.terminal

    def jump_forward_token_ids(self):
        forced, self._run_next = self._run_next, []
        if not forced and self.accepted:
            forced = list(self.forcing.get(self.accepted[-1], []))
        self.accepted += forced  # the matcher has accepted them when this returns
        return forced


class FakeBackend(GrammarBackend):
    """Compiles any constraint to a FakeCompiled; its spec says what the compile does: "bad…"
    fails with GrammarError, "crash…" raises KeyError (a bug in the library), "slow…" waits until
    the test sets `gate`, "size:N" makes a grammar of N bytes (64 otherwise). Every compile also
    takes `compile_s` and is recorded in `calls`; thread-safe, as the contract asks.

    Each matcher is a fresh `grammar_class(**grammar_options)`, kept in `grammars`. The bitmask
    has a bit for each of `vocab_size` tokens."""

    def __init__(self, grammar_class: Callable[..., Grammar] = AnyTokenGrammar, *, compile_s: float = 0.0,
                 vocab_size: int = 64, **grammar_options) -> None:
        self.grammar_class = grammar_class
        self.grammar_options = grammar_options
        self.compile_s = compile_s
        self.vocab_size = vocab_size
        self.gate = threading.Event()
        self.calls: list[str] = []  # the specs compiled, in order
        self.grammars: list[Grammar] = []
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> FakeCompiled:
        spec = constraint.spec
        with self._lock:
            self.calls.append(spec)
        if spec.startswith("bad"):
            raise GrammarError(f"regex does not compile: {spec}")
        if spec.startswith("crash"):
            raise KeyError("boom")
        if spec.startswith("slow") and not self.gate.wait(GATE_TIMEOUT_S):
            raise TimeoutError("the test never opened the compile gate")
        time.sleep(self.compile_s)
        return FakeCompiled(spec, int(spec.removeprefix("size:")) if spec.startswith("size:") else 64)

    def make_grammar(self, compiled: CompiledGrammar) -> Grammar:
        grammar = self.grammar_class(**self.grammar_options)
        self.grammars.append(grammar)
        return grammar

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return torch.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)


def scripted_backend(vocab_size: int = 256, **script) -> FakeBackend:
    """A backend whose every matcher follows `script` (ScriptedGrammar's options) from its start."""
    return FakeBackend(ScriptedGrammar, vocab_size=vocab_size, **script)


class SearchCountingGrammar(Grammar):
    """A real matcher whose closing searches are counted (`num_searches`). `recheck=False` hides its
    cheap check of an earlier closing (Grammar.completes), as a backend without one would: every
    check searches."""

    def __init__(self, grammar: Grammar, recheck: bool = True) -> None:
        self.grammar = grammar
        self.recheck = recheck
        self.num_searches = 0

    def fill_bitmask(self, bitmask, row):
        self.grammar.fill_bitmask(bitmask, row)

    def accept_tokens(self, token_ids):
        return self.grammar.accept_tokens(token_ids)

    def rollback(self, num_tokens):
        self.grammar.rollback(num_tokens)

    def is_terminated(self):
        return self.grammar.is_terminated()

    def jump_forward_token_ids(self):
        return self.grammar.jump_forward_token_ids()

    def closing_token_ids(self, max_tokens, first_fills=None):
        self.num_searches += 1
        return self.grammar.closing_token_ids(max_tokens, first_fills)

    def completes(self, token_ids, strict=False):
        return self.recheck and self.grammar.completes(token_ids, strict)
