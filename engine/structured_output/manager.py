"""The engine's side of structured output: starts compiles, activates grammars, fills bitmasks.

All grammar objects are driven from the engine thread only; compilation runs on the compiler's
thread pool and is observed here through futures, so a slow compile never blocks a step.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from engine.structured_output.grammar_output import GrammarOutput
from engine.structured_output.lazy_fills import LazyFills
from engine.structured_output.request import StructuredOutputRequest
from grammar.backend import CompiledGrammar, Grammar, GrammarBackend, GrammarError
from grammar.compiler import GrammarCompiler
from grammar.config import GrammarConfig
from grammar.runtime.early_closing import EarlyClosing
from grammar.runtime.runaway import RunawayGuard
from grammar.runtime.slow_fills import SlowFills

if TYPE_CHECKING:
    import torch

    from grammar.constraint import Constraint

# the kinds whose output the runaway guard reads as JSON
_JSON_KINDS = ("json_schema", "json_object")

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    def __init__(self, backend: GrammarBackend, config: GrammarConfig) -> None:
        self.backend = backend
        self.config = config
        self.compiler = GrammarCompiler(backend, config)
        self._futures: dict[str, Future[CompiledGrammar]] = {}
        self._bitmask = backend.allocate_bitmask(0)
        self.lazy_fills = LazyFills(backend)

    def grammar_init(self, request_id: str, request: StructuredOutputRequest) -> None:
        """Start compiling (or take the cached grammar) for a new constrained request."""
        future = self.compiler.submit(request.constraint)
        request.grammar_cache_hit = future.done() and future.exception() is None  # done at once: from the cache
        # the grammar wait ends when the compile does, not when a batch slot frees up for the request
        future.add_done_callback(lambda _: request.mark_grammar_ready(time.monotonic()))
        self._futures[request_id] = future

    def try_activate(self, request_id: str, request: StructuredOutputRequest, max_tokens: int,
                     context_left: int) -> bool:
        """True once the request has its matcher; raises ValueError if the compile failed, or if
        (closing early) the shortest output the constraint accepts does not fit in `max_tokens`
        (the request's) or `context_left` (the context left after its prompt)."""
        future = self._futures.get(request_id)
        if future is None:
            return request.grammar is not None
        if not future.done():
            return False
        del self._futures[request_id]
        compiled = future.result()  # raises GrammarError (a ValueError) on failure
        try:
            grammar = request.grammar = self.backend.make_grammar(compiled)
            request.grammar_backend = compiled.backend_name
        except Exception as e:  # e.g. MemoryError: this request's grammar failed, not the engine
            raise GrammarError(grammar_failure("building its matcher", e)) from None
        request.mark_grammar_ready(time.monotonic())  # if the compile's callback has not run yet
        if self.close_early_enabled(request):
            request.closing = self._early_closing(request.constraint, grammar)
            request.closing.check_minimum(min(max_tokens, context_left), by_context=context_left < max_tokens,
                                          min_output_tokens=compiled.min_output_tokens)
        return True

    def close_early_enabled(self, request: StructuredOutputRequest) -> bool:
        if request.constraint.close_early is not None:
            return request.constraint.close_early
        return self.config.close_early

    def _early_closing(self, constraint: Constraint, grammar: Grammar) -> EarlyClosing:
        token_bytes = self.backend.token_bytes
        guard = RunawayGuard(token_bytes) if constraint.kind in _JSON_KINDS and token_bytes is not None else None
        # a lazily compiled grammar's closing may run through states whose masks nobody built yet
        first_fills = SlowFills(self.config, lazy_masks=True) if grammar.lazy_masks else None
        return EarlyClosing(grammar, guard, first_fills)

    def is_compiling(self, request_id: str) -> bool:
        """True while the request's grammar compile is running (or queued); False once it is done,
        even before the scheduler activates it."""
        future = self._futures.get(request_id)
        return future is not None and not future.done()

    def forget(self, request_id: str) -> None:
        self._futures.pop(request_id, None)
        self.lazy_fills.forget(request_id)

    def jump_forward_enabled(self, request: StructuredOutputRequest) -> bool:
        if request.constraint.jump_forward is not None:
            return request.constraint.jump_forward
        return self.config.jump_forward

    def fill_bitmask(self, requests_and_rows: list[tuple[str, StructuredOutputRequest, int]],
                     drafts: dict[str, list[int]] | None = None) -> GrammarOutput:
        """Fill each request's row; a request with a draft (`drafts`: req_id -> its draft tokens)
        fills 1 + len(draft) rows from its row on: the matcher is advanced through the draft for
        the rows after the first and rolled back afterwards. A lazily compiled grammar's single
        row is filled on the LazyFills pool instead: `finish_bitmask` puts it in place."""
        drafts = drafts or {}
        num_rows = max((row + 1 + len(drafts.get(req_id, ())) for req_id, _, row in requests_and_rows), default=0)
        if self._bitmask.shape[0] < num_rows:
            self._bitmask = self.backend.allocate_bitmask(max(num_rows, 2 * self._bitmask.shape[0]))
        bitmask = self._bitmask[:num_rows]
        failed: dict[str, str] = {}
        lazy: list[str] = []
        for req_id, request, row in requests_and_rows:
            grammar = request.grammar
            draft = drafts.get(req_id, [])
            if grammar.lazy_masks:
                if not draft:
                    self.lazy_fills.start(req_id, grammar)
                    lazy.append(req_id)
                    continue
                self.lazy_fills.forget(req_id)  # a row filled earlier: the draft moves on from it
            start = time.thread_time()  # CPU time: a preempted thread is not the grammar's fault
            try:
                _fill_rows(grammar, bitmask, row, draft)
            except Exception as e:
                bitmask[row:row + 1 + len(draft)] = 0
                failed[req_id] = grammar_failure("filling its bitmask", e)
                continue
            error = self._slow_fill_error(request, (time.thread_time() - start) * 1000 / (1 + len(draft)))
            if error is not None:
                failed[req_id] = error
        return GrammarOutput({req_id: row for req_id, _, row in requests_and_rows}, bitmask, failed, lazy)

    def finish_bitmask(self, grammar_output: GrammarOutput,
                       requests: dict[str, StructuredOutputRequest]) -> dict[str, str]:
        """After the forward: the rows filled on the LazyFills pool, into the step's bitmask. A fill
        still running is `grammar_output.deferred` (its request skips this sample). Returns the
        requests whose fill failed or was too slow (req_id -> why), as fill_bitmask's `failed`."""
        if not grammar_output.lazy_req_ids:
            return {}
        rows = grammar_output.structured_output_request_ids
        done_ms, errors, deferred = self.lazy_fills.collect(grammar_output.lazy_req_ids,
                                                            grammar_output.grammar_bitmask, rows)
        failed: dict[str, str] = {}
        for req_id, error in errors.items():
            grammar_output.grammar_bitmask[rows[req_id]] = 0
            failed[req_id] = grammar_failure("filling its bitmask", error)
        for req_id, fill_ms in done_ms.items():
            message = self._slow_fill_error(requests[req_id], fill_ms)
            if message is not None:
                failed[req_id] = message
        grammar_output.failed.update(failed)
        grammar_output.deferred = deferred
        return failed

    def _slow_fill_error(self, request: StructuredOutputRequest, fill_ms: float) -> str | None:
        """Why the request ends if a fill of `fill_ms` (CPU) is one slow fill too many, else None."""
        if fill_ms <= self.config.max_fill_ms:
            return None
        slow_fills = request.slow_fills
        if slow_fills is None:
            slow_fills = request.slow_fills = SlowFills(self.config, request.grammar.lazy_masks)
        if slow_fills.allows(fill_ms):
            return None
        return f"one bitmask fill of this constraint took {fill_ms:.0f} ms, over {slow_fills.limit_text()}; simplify it"

    def wait_for_any(self, timeout_s: float) -> None:
        """Block up to `timeout_s` until some compile, or some lazily compiled grammar's fill,
        finishes (the core idles here, not in a spin)."""
        from concurrent.futures import FIRST_COMPLETED, wait
        pending = [f for f in self._futures.values() if not f.done()] + self.lazy_fills.running()
        if pending:
            wait(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)
            self.lazy_fills.promote_starved()

    def shutdown(self) -> None:
        self.compiler.shutdown()
        self.lazy_fills.shutdown()


def _fill_rows(grammar: Grammar, bitmask: torch.Tensor, row: int, draft: list[int]) -> None:
    """Row `row` for the next token, then one row after each draft token."""
    grammar.fill_bitmask(bitmask, row)
    num_accepted = 0
    try:
        for token_id in draft:
            if not grammar.accept_tokens([token_id]):  # the scheduler cut the draft to what it accepts
                raise GrammarError(f"the grammar rejected draft token {token_id} it accepted when drafting")
            num_accepted += 1
            grammar.fill_bitmask(bitmask, row + num_accepted)
    finally:
        grammar.rollback(num_accepted)


def grammar_failure(what: str, error: BaseException) -> str:
    """The message of a request whose grammar work raised (logged once, without a traceback)."""
    logger.warning("grammar work failed while %s: %s: %s", what, type(error).__name__, error)
    return f"the constraint's grammar failed while {what}: {type(error).__name__}: {error}"
