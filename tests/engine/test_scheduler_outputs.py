"""What the scheduler reports: the counters on a request's first and final outputs, and the calls
that touch requests from outside a step (abort, rejected requests)."""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step

from engine.protocol import EngineCoreOutput, FinishReason, TokenLogprob
from engine.sched.request import RequestStatus
from engine.sched.scheduler_output import ModelRunnerOutput


def test_first_and_final_outputs_carry_the_counters():
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=8)
    shared = list(range(10, 18))  # two full blocks
    warm = make_request(token_ids=shared, max_tokens=1)
    scheduler.add_request(warm)
    sample_step(scheduler, scheduler.schedule())
    request = make_request(token_ids=shared + list(range(30, 40)), max_tokens=3, stop_token_ids=[9])
    request.arrival_time -= 5.0  # waited 5 s before its first step
    scheduler.add_request(request)
    assert sample_step(scheduler, scheduler.schedule()) == []  # 8 of the 10 uncached tokens: no output yet
    (first,) = sample_step(scheduler, scheduler.schedule(), token_id=7)
    assert first.new_token_ids == [7] and first.finish_reason is None
    assert (first.counters.num_prompt_tokens, first.counters.num_cached_tokens) == (18, 8)
    assert first.counters.queued_s >= 5.0
    (middle,) = sample_step(scheduler, scheduler.schedule(), token_id=8)
    assert middle == EngineCoreOutput(request.request_id, [8])  # no counters between the first and the last
    (final,) = sample_step(scheduler, scheduler.schedule(), token_id=9)
    assert final.new_token_ids == [9]
    assert final.finish_reason == FinishReason.STOP and final.stop_reason == 9
    assert (final.counters.num_prompt_tokens, final.counters.num_cached_tokens) == (18, 8)
    assert final.counters.num_forward_passes == 4 and final.counters.num_forced_tokens == 0
    assert final.counters.queued_s >= 5.0 and final.counters.grammar_wait_s == 0.0 and final.error is None
    assert request.status == RequestStatus.FINISHED_STOPPED and not scheduler.has_unfinished_requests()


def test_length_and_eos_finish_reasons():
    scheduler = make_scheduler()
    length, eos = make_request(num_tokens=3, max_tokens=1, ignore_eos=True), make_request(num_tokens=3, max_tokens=5)
    eos_ignored = make_request(num_tokens=3, max_tokens=2, ignore_eos=True)
    for r in (length, eos, eos_ignored):
        scheduler.add_request(r)
    outputs = {o.request_id: o for o in sample_step(scheduler, scheduler.schedule(), token_id=2)}  # 2 is EOS
    assert outputs[length.request_id].finish_reason == FinishReason.LENGTH
    assert outputs[length.request_id].stop_reason is None
    assert outputs[eos.request_id].finish_reason == FinishReason.STOP and outputs[eos.request_id].stop_reason == 2
    assert outputs[eos_ignored.request_id].finish_reason is None and eos_ignored.status == RequestStatus.RUNNING


def test_abort_of_unknown_or_finished_requests_changes_nothing():
    scheduler = make_scheduler()
    done, running = make_request(num_tokens=3, max_tokens=1), make_request(num_tokens=3, max_tokens=5)
    scheduler.add_request(done)
    scheduler.add_request(running)
    sample_step(scheduler, scheduler.schedule())
    assert done.is_finished
    free_before = scheduler.kv_cache_manager.num_free_blocks
    scheduler.abort_requests(["no-such-request", done.request_id])
    assert running.status == RequestStatus.RUNNING and scheduler.kv_cache_manager.num_free_blocks == free_before
    assert done.status == RequestStatus.FINISHED_LENGTH_CAPPED  # not turned into an abort
    scheduler.abort_requests([running.request_id, running.request_id])  # twice: the second does nothing
    assert running.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.schedule().finished_req_ids == {done.request_id, running.request_id}


def test_a_reported_output_keeps_the_scheduler_busy_until_it_is_delivered():
    scheduler = make_scheduler()
    rejected = EngineCoreOutput("bad", finish_reason=int(FinishReason.ERROR), error="the prompt is empty")
    scheduler.report(rejected)
    assert scheduler.has_unfinished_requests() and not scheduler.requests
    so = scheduler.schedule()
    assert so.is_empty
    assert scheduler.update_from_output(so, None) == [rejected]
    assert not scheduler.has_unfinished_requests()


def test_logprobs_reach_the_first_middle_and_final_outputs():
    scheduler = make_scheduler()
    request = make_request(num_tokens=3, max_tokens=3, logprobs=0)
    scheduler.add_request(request)
    for step in range(3):
        so = scheduler.schedule()
        logprob = TokenLogprob(5 + step, -0.5 * step, [])
        (out,) = scheduler.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens),
                                                                    {request.request_id: [5 + step]},
                                                                    {request.request_id: [logprob]}))
        assert out.new_token_ids == [5 + step] and out.new_logprobs == [logprob]
    assert out.finish_reason == FinishReason.LENGTH


def test_a_grammar_dead_end_ends_only_that_request():
    scheduler = make_scheduler()
    stuck, other = make_request(num_tokens=3), make_request(num_tokens=3)
    scheduler.add_request(stuck)
    scheduler.add_request(other)
    so = scheduler.schedule()
    outputs = scheduler.update_from_output(so, ModelRunnerOutput(
        list(so.num_scheduled_tokens), {other.request_id: [5]}, dead_end_req_ids={stuck.request_id}))
    by_id = {o.request_id: o for o in outputs}
    assert stuck.status == RequestStatus.FINISHED_ERROR
    assert by_id[stuck.request_id].finish_reason == FinishReason.ERROR
    assert by_id[stuck.request_id].error == "grammar dead end: no token is allowed at this position"
    assert by_id[stuck.request_id].new_token_ids == [] and by_id[stuck.request_id].counters.num_forward_passes == 1
    assert other.status == RequestStatus.RUNNING and by_id[other.request_id].new_token_ids == [5]
    assert scheduler.kv_cache_manager.get_block_ids(stuck.request_id) == []


def test_a_new_request_sends_no_token_ids_again_on_its_next_step():
    scheduler = make_scheduler()
    request = make_request(num_tokens=3)
    scheduler.add_request(request)
    sample_step(scheduler, scheduler.schedule())
    so = scheduler.schedule()
    assert so.scheduled_cached_reqs.new_token_ids == [[]]  # the runner sampled it: it has it already


def test_a_running_request_with_nothing_to_compute_does_not_hide_the_next_one():
    scheduler = make_scheduler()
    idle, busy = make_request(num_tokens=3), make_request(num_tokens=3)
    scheduler.add_request(idle)
    scheduler.add_request(busy)
    so = scheduler.schedule()
    # the runner gave idle nothing this step (as for a request aborted on the runner side)
    scheduler.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens), {busy.request_id: [5]}))
    extra = make_request(num_tokens=3)
    scheduler.add_request(extra)
    assert scheduler.schedule().num_scheduled_tokens == {busy.request_id: 1, extra.request_id: 3}
