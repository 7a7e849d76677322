"""A lazily compiled grammar's fills run off the engine thread: a state whose mask is still being
built holds back its own request only, never the step of everyone else."""
from __future__ import annotations

import os
import sys
import threading

import torch
from conftest import make_request, make_scheduler
from grammar_fakes import AnyTokenGrammar, FakeBackend
from test_grammar_isolation import sample, wait_compiled

from engine.structured_output.lazy_fills import LazyFills
from engine.sched.request import RequestStatus
from engine.structured_output.manager import StructuredOutputManager
from engine.worker.model_runner import _ParkedLogits, _without
from grammar.config import GrammarConfig
from grammar.constraint import Constraint
from grammar.runtime.low_priority import ThreadScheduling

LAZY = Constraint(kind="regex", spec="lazy")


def _step(scheduler):
    so = scheduler.schedule()
    grammar_output = scheduler.get_grammar_bitmask(so)
    scheduler.finish_grammar_bitmask(grammar_output)
    sample(scheduler, so)
    return so, grammar_output


def _scheduler_with(gate: threading.Event, *requests):
    backend = FakeBackend(lazy_masks=True, first_fill_gate=gate)  # a state being built: its first fill waits
    manager = StructuredOutputManager(backend, GrammarConfig())
    scheduler = make_scheduler(structured_output_manager=manager)
    for request in requests:
        scheduler.add_request(request)
    wait_compiled(manager)
    return backend, manager, scheduler


def test_a_state_being_built_holds_back_only_its_own_request():
    gate = threading.Event()
    lazy = make_request(num_tokens=5, max_tokens=3, constraint=LAZY)
    plain = make_request(num_tokens=5, max_tokens=3)
    backend, manager, scheduler = _scheduler_with(gate, lazy, plain)
    try:
        so, grammar_output = _step(scheduler)  # both prefill and would sample: the lazy row is not ready
        assert set(so.num_scheduled_tokens) == {lazy.request_id, plain.request_id}
        assert grammar_output.deferred == {lazy.request_id}
        assert plain.num_output_tokens == 1 and lazy.num_output_tokens == 0
        assert lazy.num_computed_tokens == lazy.num_tokens - 1  # its last token is computed again later
        assert scheduler.num_waiting_for_fill == 1
        so, _ = _step(scheduler)  # not scheduled while its fill runs; the other request goes on
        assert set(so.num_scheduled_tokens) == {plain.request_id}
        assert plain.num_output_tokens == 2 and lazy.num_output_tokens == 0
    finally:
        gate.set()
    manager.wait_for_any(10)
    assert scheduler.num_waiting_for_fill == 0
    so, grammar_output = _step(scheduler)  # the finished row is used: no second fill of that state
    assert so.num_scheduled_tokens[lazy.request_id] == 1 and not grammar_output.deferred
    assert lazy.num_output_tokens == 1
    for _ in range(20):  # each token takes a step, or two where its fill is still building (a busy machine)
        if lazy.is_finished and plain.is_finished:
            break
        _step(scheduler)
        manager.wait_for_any(10)
    assert lazy.status == plain.status == RequestStatus.FINISHED_LENGTH_CAPPED
    grammar = backend.grammars[0]
    assert grammar.num_fills == 3  # one per sampled token
    assert grammar.fill_policies and all(name.startswith("formwork-lazy-fill") for name in grammar.fill_policies)
    if sys.platform.startswith("linux"):  # in the gaps the forward leaves, not in its CPU, where a
        # starved fill can be promoted again; elsewhere at normal priority (grammar/runtime/low_priority.py)
        scheduling = ThreadScheduling()
        demoted = scheduling.may_restore(scheduling.own_nice())
        assert set(grammar.fill_policies.values()) == {os.SCHED_IDLE if demoted else os.SCHED_OTHER}
    pool = scheduler.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1  # every block back (one is the null block)
    manager.shutdown()


def test_an_aborted_request_s_running_fill_finishes_unseen():
    gate = threading.Event()
    lazy = make_request(num_tokens=5, max_tokens=3, constraint=LAZY)
    _, manager, scheduler = _scheduler_with(gate, lazy)
    _step(scheduler)
    scheduler.abort_requests([lazy.request_id])
    gate.set()
    assert scheduler.num_waiting_for_fill == 0 and not scheduler.requests
    manager.shutdown()


def test_fills_that_finish_in_time_are_put_in_place():
    fills = LazyFills(FakeBackend())
    grammar = AnyTokenGrammar()
    fills.start("a", grammar)
    bitmask = torch.zeros(3, 2, dtype=torch.int32)
    done, failed, deferred = fills.collect(["a"], bitmask, {"a": 2}, wait_s=10)
    assert set(done) == {"a"} and not failed and not deferred
    assert torch.equal(bitmask[2], torch.full((2,), -1, dtype=torch.int32)) and not torch.any(bitmask[:2])
    fills.shutdown()


def test_the_rows_of_requests_that_do_not_sample_are_left_out():
    logits = torch.arange(6.0)[:, None].repeat(1, 4)  # rows: a, b, b's draft, b's draft, c, c's draft
    parked = _ParkedLogits(["a", "b", "c"], ["a", "b", "c"], [0, 2, 1], {"b": [7, 8], "c": [9]}, logits)
    kept = _without(parked, {"b"})
    assert kept.sampling_req_ids == ["a", "c"] and kept.num_draft_tokens == [0, 1]
    assert kept.logits[:, 0].tolist() == [0.0, 4.0, 5.0]
