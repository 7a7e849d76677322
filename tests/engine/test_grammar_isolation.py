"""A grammar whose work raises or runs past a limit ends its own request, never the engine."""
from __future__ import annotations

import pytest
import torch
from conftest import make_request, make_scheduler
from grammar_fakes import FakeBackend

from engine.protocol import ErrorKind, FinishReason
from engine.sched.request import RequestStatus
from engine.sched.scheduler_output import ModelRunnerOutput
from engine.structured_output.manager import StructuredOutputManager
from grammar.backend import GrammarError
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

MAX_FILL_MS = 5.0
SLOW_FILL_CPU_S = 0.02  # four times MAX_FILL_MS: a fill without it stays under the limit


def wait_compiled(manager):
    for future in list(manager._futures.values()):
        try:
            future.result(timeout=10)
        except GrammarError:
            pass


def sample(scheduler, scheduler_output, token_id=100):
    """A runner's answer: a token for each request that samples (a request the bitmask fill
    ended meanwhile gets one too; the scheduler must drop it)."""
    sampled = {}
    for req_id in scheduler_output.num_scheduled_tokens:
        request = scheduler.requests.get(req_id)
        if request is None or request.num_computed_tokens == request.num_tokens:
            sampled[req_id] = [token_id]
    return scheduler.update_from_output(
        scheduler_output, ModelRunnerOutput(list(scheduler_output.num_scheduled_tokens), sampled))


def run_until_done(scheduler, requests, max_steps=20):
    outputs = {}
    for _ in range(max_steps):
        if all(r.is_finished for r in requests):
            break
        so = scheduler.schedule()
        # as the engine step: fills of lazily compiled grammars are put in place after the forward
        scheduler.finish_grammar_bitmask(scheduler.get_grammar_bitmask(so))
        for output in sample(scheduler, so):  # a request whose fill still runs has no token to sample
            if output.finish_reason is not None:
                outputs[output.request_id] = output
        if so.is_empty and scheduler.num_waiting_for_fill:
            scheduler.structured_output_manager.wait_for_any(10)
    return outputs


@pytest.mark.parametrize("where", ["make", "fill", "accept", "jump_forward"])
def test_grammar_exception_ends_only_its_request(where):
    backend = FakeBackend(bad_alloc_in=where)
    manager = StructuredOutputManager(backend, GrammarConfig())
    scheduler = make_scheduler(structured_output_manager=manager)
    bad = make_request(num_tokens=5, max_tokens=4, constraint=Constraint(kind="regex", spec="a+"))
    plain = make_request(num_tokens=5, max_tokens=4)
    scheduler.add_request(bad)
    scheduler.add_request(plain)
    wait_compiled(manager)
    outputs = run_until_done(scheduler, [bad, plain])
    assert bad.status == RequestStatus.FINISHED_ERROR and bad.error_kind == ErrorKind.CONSTRAINT
    assert outputs[bad.request_id].finish_reason == FinishReason.ERROR
    assert outputs[bad.request_id].error_kind == ErrorKind.CONSTRAINT
    assert "std::bad_alloc" in outputs[bad.request_id].error
    assert plain.status == RequestStatus.FINISHED_LENGTH_CAPPED  # the other request ran to its end
    assert scheduler.kv_cache_manager.pool.num_free_blocks == scheduler.kv_cache_manager.pool.num_blocks - 1


def test_a_fill_over_max_fill_ms_ends_its_request():
    backend = FakeBackend(fill_cpu_s=SLOW_FILL_CPU_S)
    manager = StructuredOutputManager(backend, GrammarConfig(max_fill_ms=MAX_FILL_MS))
    scheduler = make_scheduler(structured_output_manager=manager)
    slow = make_request(num_tokens=5, max_tokens=4, constraint=Constraint(kind="regex", spec="a+"))
    scheduler.add_request(slow)
    wait_compiled(manager)
    outputs = run_until_done(scheduler, [slow])
    slow_output = outputs[slow.request_id]
    assert "max_fill_ms" in slow_output.error and slow_output.error_kind == ErrorKind.CONSTRAINT


@pytest.mark.parametrize("budget_ms, ends_in_error", [(60_000.0, False), (0.001, True)])
def test_a_lazy_grammar_s_slow_fills_run_within_its_budget(budget_ms, ends_in_error):
    # a state's first fill builds its mask: slow fills count against a budget
    backend = FakeBackend(lazy_masks=True, fill_cpu_s=SLOW_FILL_CPU_S)
    manager = StructuredOutputManager(backend, GrammarConfig(max_fill_ms=MAX_FILL_MS, lazy_fill_budget_ms=budget_ms))
    scheduler = make_scheduler(structured_output_manager=manager)
    slow = make_request(num_tokens=5, max_tokens=4, constraint=Constraint(kind="regex", spec="a+"))
    scheduler.add_request(slow)
    wait_compiled(manager)
    outputs = run_until_done(scheduler, [slow])
    if ends_in_error:
        assert "lazy_fill_budget_ms" in outputs[slow.request_id].error
    else:
        assert slow.status == RequestStatus.FINISHED_LENGTH_CAPPED and slow.structured_output.slow_fills.spent_ms > 0


def test_bitmask_row_of_a_failed_fill_allows_nothing():
    backend = FakeBackend(bad_alloc_in="fill")
    manager = StructuredOutputManager(backend, GrammarConfig())
    scheduler = make_scheduler(structured_output_manager=manager)
    bad = make_request(num_tokens=5, constraint=Constraint(kind="regex", spec="a+"))
    scheduler.add_request(bad)
    wait_compiled(manager)
    so = scheduler.schedule()
    grammar_output = scheduler.get_grammar_bitmask(so)
    assert set(grammar_output.failed) == {bad.request_id}
    assert not torch.any(grammar_output.grammar_bitmask[0])
    assert bad.status == RequestStatus.FINISHED_ERROR
