"""Jump-forward in the scheduler: forced tokens are appended, sent to the runner once, cut at the
length limits (rolling the grammar back), stop the request, survive preemption, and can be switched off.

A scripted grammar stands in for xgrammar: it allows everything and forces a fixed run of tokens
after each sampled token, so every count below is known in advance.
"""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step
from grammar_fakes import scripted_backend

from engine.sched.request import RequestStatus
from engine.structured_output.manager import StructuredOutputManager
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

SAMPLED = 100
FORCED = [50, 51, 52]
EOS = 2


def setup(runs=(FORCED,), engine_jump_forward: bool = True, terminal=(), **scheduler_options):
    backend = scripted_backend(runs=runs, terminal=terminal)
    manager = StructuredOutputManager(backend, GrammarConfig(jump_forward=engine_jump_forward))
    return backend, make_scheduler(structured_output_manager=manager, **scheduler_options)


def add(scheduler, jump_forward: bool | None = None, **request_options):
    request = make_request(num_tokens=5, constraint=Constraint(kind="regex", spec=".*", jump_forward=jump_forward),
                           **request_options)
    scheduler.add_request(request)
    for future in list(scheduler.structured_output_manager._futures.values()):
        future.result(timeout=30)
    return request


def cached_tokens_of(scheduler_output, request) -> list[int]:
    cached = scheduler_output.scheduled_cached_reqs
    return cached.new_token_ids[cached.req_ids.index(request.request_id)]


def test_forced_tokens_are_appended_and_sent_to_the_runner_once():
    backend, scheduler = setup()
    request = add(scheduler, max_tokens=10)
    outputs = sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert outputs[0].new_token_ids == [SAMPLED] + FORCED  # the client sees them at once
    assert request.output_token_ids == [SAMPLED] + FORCED
    assert request.structured_output.num_forced_tokens_pending == 3 and request.counters.num_forced_tokens == 3
    assert backend.grammars[0].accepted == [SAMPLED] + FORCED

    so = scheduler.schedule()
    assert cached_tokens_of(so, request) == FORCED  # the runner did not sample these: it gets them here
    assert so.num_scheduled_tokens == {request.request_id: 4}  # the sampled token and the forced ones, one pass
    assert so.structured_output_request_ids == {request.request_id: 0}
    assert request.structured_output.num_forced_tokens_pending == 0
    sample_step(scheduler, so, SAMPLED)

    so = scheduler.schedule()
    assert cached_tokens_of(so, request) == [] and so.num_scheduled_tokens == {request.request_id: 1}
    assert request.counters.num_forced_tokens == 3


def test_forced_tokens_longer_than_the_budget_are_sent_once_and_computed_over_two_steps():
    _, scheduler = setup(max_num_batched_tokens=2)
    request = add(scheduler, max_tokens=10)
    while not request.output_token_ids:
        sample_step(scheduler, scheduler.schedule(), SAMPLED)  # the 5-token prompt in chunks of 2
    so = scheduler.schedule()
    assert cached_tokens_of(so, request) == FORCED and so.num_scheduled_tokens == {request.request_id: 2}
    assert so.structured_output_request_ids == {}  # mid catch-up: nothing is sampled
    assert sample_step(scheduler, so, SAMPLED) == []
    so = scheduler.schedule()
    assert cached_tokens_of(so, request) == [] and so.num_scheduled_tokens == {request.request_id: 2}
    assert [o.new_token_ids for o in sample_step(scheduler, so, SAMPLED)] == [[SAMPLED]]


def test_forced_tokens_are_cut_at_max_tokens_and_the_grammar_rolls_back():
    backend, scheduler = setup()
    request = add(scheduler, max_tokens=3)
    outputs = sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.output_token_ids == [SAMPLED] + FORCED[:2]
    assert backend.grammars[0].rolled_back == [1]
    assert backend.grammars[0].accepted == [SAMPLED] + FORCED[:2]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert outputs[0].finish_reason == 1 and outputs[0].counters.num_forced_tokens == 2


def test_forced_tokens_are_cut_at_the_context_length():
    backend, scheduler = setup(max_model_len=7)
    request = add(scheduler, max_tokens=50)  # 5 prompt tokens + 1 sampled: room for 1 forced token
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.output_token_ids == [SAMPLED, FORCED[0]]
    assert backend.grammars[0].rolled_back == [2]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED and request.num_tokens == 7


def test_nothing_forced_when_no_room_is_left():
    backend, scheduler = setup()
    request = add(scheduler, max_tokens=1)
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.output_token_ids == [SAMPLED] and request.counters.num_forced_tokens == 0
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_a_forced_stop_token_finishes_the_request():
    _, scheduler = setup(runs=([50, EOS],))
    request = add(scheduler, max_tokens=10)
    outputs = sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason == EOS
    assert outputs[0].new_token_ids == [SAMPLED, 50, EOS] and outputs[0].finish_reason == 0


def test_forced_text_that_completes_the_grammar_finishes_the_request():
    _, scheduler = setup(runs=([50, 51],), terminal={51})
    request = add(scheduler, max_tokens=10)
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.status == RequestStatus.FINISHED_STOPPED and request.output_token_ids == [SAMPLED, 50, 51]


def test_pending_forced_tokens_are_resent_in_full_after_preemption():
    _, scheduler = setup()
    request = add(scheduler, max_tokens=10)
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.structured_output.num_forced_tokens_pending == 3
    scheduler.running.remove(request)
    scheduler._preempt(request)
    assert request.structured_output.num_forced_tokens_pending == 0
    so = scheduler.schedule()
    assert so.preempted_req_ids == {request.request_id}
    (new,) = so.scheduled_new_reqs
    assert new.token_ids[-4:] == [SAMPLED] + FORCED and so.num_scheduled_tokens == {request.request_id: 9}
    assert so.scheduled_cached_reqs.req_ids == []


def test_jump_forward_off_for_the_request():
    backend, scheduler = setup()
    request = add(scheduler, jump_forward=False, max_tokens=10)
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert request.output_token_ids == [SAMPLED] and request.counters.num_forced_tokens == 0


def test_jump_forward_off_for_the_engine_and_on_for_one_request():
    _, scheduler = setup(runs=(FORCED, FORCED), engine_jump_forward=False)
    default, opted_in = add(scheduler, max_tokens=10), add(scheduler, jump_forward=True, max_tokens=10)
    sample_step(scheduler, scheduler.schedule(), SAMPLED)
    assert default.output_token_ids == [SAMPLED]
    assert opted_in.output_token_ids == [SAMPLED] + FORCED


def test_a_sampled_token_the_grammar_rejects_ends_the_request_with_an_error():
    backend, scheduler = setup()
    request = add(scheduler, max_tokens=10)
    so = scheduler.schedule()  # the grammar is made when the request is admitted
    backend.grammars[0].accept_tokens = lambda token_ids: False  # a runner that ignored the bitmask
    (out,) = sample_step(scheduler, so, SAMPLED)
    assert request.status == RequestStatus.FINISHED_ERROR
    assert out.finish_reason == 3 and out.error == f"internal error: the grammar rejected sampled token {SAMPLED}"
    assert out.new_token_ids == [SAMPLED] and request.counters.num_forced_tokens == 0
