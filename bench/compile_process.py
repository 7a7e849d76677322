"""One schema compile at a time in a child process that is killed at the time limit.

For `formwork bench coverage --compile-only` (bench/compile_coverage.py): xgrammar cannot stop a
compile once started, so a schema past the limit costs the limit and no more. The backend is the
engine's (grammar/selection.py), as --grammar-backend names it.
"""
from __future__ import annotations

import multiprocessing
import time

from bench.coverage import rejection_reason


def _compile_worker(connection, model_dir: str, vocab_size: int, config) -> None:
    """A child process: compiles each schema text it is sent with the backend `config` names
    (GrammarConfig.grammar_backend, "auto": picked per schema), answers (ok, reason, backend)."""
    from grammar.backend import GrammarError
    from grammar.constraint import Constraint
    from grammar.json_schema.limits import check_limits
    from grammar.runtime.low_priority import run_at_low_priority
    from grammar.selection import make_selecting_backend

    # a spare loads while another process compiles: loading both backends at idle priority keeps
    # it from taking that compile's CPU (and its time limit)
    backend = run_at_low_priority(make_selecting_backend, model_dir, vocab_size, config)
    for name in ("xgrammar", "llguidance"):  # first-compile costs, not a schema's
        backend.compile(Constraint(kind="json_schema", spec='{"type": "integer"}', grammar_backend=name))
    connection.send("ready")
    while (spec := connection.recv()) is not None:
        constraint = Constraint(kind="json_schema", spec=spec, strict=True)
        try:
            check_limits(constraint, config.max_spec_bytes, config.max_schema_depth)
            compiled = backend.compile(constraint)
            connection.send((True, "", compiled.backend_name))
        except GrammarError as e:
            connection.send((False, rejection_reason(str(e)), ""))


class CompileProcess:
    """xgrammar cannot stop a compile once started: a schema past the time limit is refused and its
    process killed, so it costs the limit and no more (GrammarCompiler's thread would run on). A
    spare process starts beside the one in use, so a kill does not wait for a tokenizer to load."""

    def __init__(self, model_dir: str, vocab_size: int, config) -> None:
        self._args = (model_dir, vocab_size, config)
        self._current = None
        self._spare = self._spawn()

    def _spawn(self):
        context = multiprocessing.get_context("spawn")
        connection, child = context.Pipe()
        process = context.Process(target=_compile_worker, args=(child, *self._args), daemon=True)
        process.start()
        return process, connection

    def compile(self, spec: str, timeout_s: float) -> tuple[bool, str, float, str]:
        """(compiled, why not, seconds, the backend that compiled it); the seconds leave out
        starting a process."""
        if self._current is None:
            self._current, self._spare = self._spare, self._spawn()
            if self._current[1].recv() != "ready":
                raise RuntimeError("the compile process did not start")
        connection = self._current[1]
        started = time.perf_counter()
        connection.send(spec)
        if connection.poll(timeout_s):
            ok, reason, backend = connection.recv()
            return ok, reason, time.perf_counter() - started, backend
        seconds = time.perf_counter() - started
        self._kill(self._current)
        self._current = None
        return False, "compile time limit", seconds, ""

    @staticmethod
    def _kill(pair) -> None:
        pair[0].kill()
        pair[0].join()

    def close(self) -> None:
        for pair in (self._current, self._spare):
            if pair is not None:
                self._kill(pair)
        self._current = self._spare = None
