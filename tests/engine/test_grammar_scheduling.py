"""Requests whose grammar compiles asynchronously: they wait, nobody waits for them."""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step
from grammar_fakes import FakeBackend

from engine.protocol import FinishReason
from engine.sched.request import RequestStatus
from engine.structured_output.manager import StructuredOutputManager
from grammar.backend import GrammarError
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

SLOW = Constraint(kind="regex", spec="slow")  # compiles once the test opens the backend's gate


def setup():
    backend = FakeBackend()
    manager = StructuredOutputManager(backend, GrammarConfig(compile_timeout_s=30))
    return backend, manager, make_scheduler(structured_output_manager=manager)


def wait_compiled(manager):
    for future in list(manager._futures.values()):
        try:
            future.result(timeout=10)
        except GrammarError:
            pass


def test_slow_compile_does_not_delay_others():
    backend, manager, scheduler = setup()
    slow = make_request(num_tokens=5, constraint=SLOW)
    plain = make_request(num_tokens=5)
    scheduler.add_request(slow)
    scheduler.add_request(plain)
    assert slow.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    for _ in range(3):  # the plain request runs; the constrained one keeps waiting in front of the queue
        so = scheduler.schedule()
        assert list(so.num_scheduled_tokens) == [plain.request_id]
        sample_step(scheduler, so)
    assert scheduler.num_waiting_for_grammar == 1 and slow.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    backend.gate.set()
    wait_compiled(manager)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {plain.request_id: 1, slow.request_id: 5}
    assert slow.status == RequestStatus.RUNNING and slow.grammar is not None
    assert so.structured_output_request_ids == {slow.request_id: 0}
    grammar_output = scheduler.get_grammar_bitmask(so)
    assert grammar_output.grammar_bitmask.shape == (1, 2)


def test_compile_failure_finishes_only_that_request():
    backend, manager, scheduler = setup()
    bad = make_request(num_tokens=5, constraint=Constraint(kind="regex", spec="bad"))
    plain = make_request(num_tokens=5)
    scheduler.add_request(bad)
    scheduler.add_request(plain)
    backend.gate.set()
    wait_compiled(manager)
    so = scheduler.schedule()
    assert list(so.num_scheduled_tokens) == [plain.request_id]
    assert bad.status == RequestStatus.FINISHED_ERROR
    outputs = {o.request_id: o for o in sample_step(scheduler, so)}
    assert outputs[bad.request_id].finish_reason == FinishReason.ERROR
    assert "does not compile" in outputs[bad.request_id].error
    assert outputs[bad.request_id].new_token_ids == [] and outputs[bad.request_id].counters.num_prompt_tokens == 5
    assert plain.status == RequestStatus.RUNNING


def test_abort_while_compiling():
    backend, manager, scheduler = setup()
    request = make_request(num_tokens=5, constraint=SLOW)
    scheduler.add_request(request)
    scheduler.schedule()
    scheduler.abort_requests([request.request_id])
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.num_waiting_for_grammar == 0 and not scheduler.has_unfinished_requests()
    backend.gate.set()  # the compile finishing later touches nothing
    wait_compiled(manager)
    assert scheduler.schedule().is_empty


def test_requests_with_a_compiled_grammar_queued_for_a_slot_are_waiting_not_waiting_for_grammar():
    backend, manager, _ = setup()
    scheduler = make_scheduler(max_num_seqs=2, structured_output_manager=manager)
    requests = [make_request(num_tokens=5, constraint=SLOW) for _ in range(5)]
    for request in requests:
        scheduler.add_request(request)
    scheduler.schedule()
    assert scheduler.num_waiting_for_grammar == 5  # the compile is still running for all of them
    backend.gate.set()
    wait_compiled(manager)
    assert scheduler.num_waiting_for_grammar == 0  # compiled, not activated yet: waiting for a slot
    sample_step(scheduler, scheduler.schedule())
    assert len(scheduler.running) == 2 and len(scheduler.waiting) == 3
    assert all(r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR for r in scheduler.waiting)
    assert scheduler.num_waiting_for_grammar == 0


def test_the_grammar_wait_ends_with_the_compile_not_with_a_free_slot():
    backend, manager, _ = setup()
    scheduler = make_scheduler(max_num_seqs=1, structured_output_manager=manager)
    first, second = (make_request(num_tokens=5, max_tokens=3, constraint=SLOW)
                     for _ in range(2))
    scheduler.add_request(first)
    scheduler.add_request(second)
    backend.gate.set()
    wait_compiled(manager)
    compiled_by = second.structured_output.grammar_ready_time
    assert compiled_by is not None  # set by the compile, while `second` still waits for the one slot
    outputs = []
    while scheduler.has_unfinished_requests():
        outputs += sample_step(scheduler, scheduler.schedule())
    final = next(o for o in outputs if o.request_id == second.request_id and o.finish_reason is not None)
    assert second.structured_output.grammar_ready_time == compiled_by  # activation, three steps later, did not move it
    assert second.first_scheduled_time > compiled_by
    assert final.counters.grammar_wait_s == compiled_by - second.arrival_time < final.counters.queued_s
    # compiled, not from the cache
    assert not first.structured_output.grammar_cache_hit and not second.structured_output.grammar_cache_hit
    third = make_request(num_tokens=5, constraint=SLOW)
    scheduler.add_request(third)
    assert third.structured_output.grammar_cache_hit and third.structured_output.grammar_ready_time is not None
