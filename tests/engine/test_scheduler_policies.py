"""Scheduler options and policies: chunked prefill off, prefix caching off, resetting the prefix cache,
and who is preempted when the KV cache is full (priorities, a request preempting itself)."""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step

from engine.sched.request import RequestStatus


def admitted(scheduler_output) -> list[str]:
    return [n.req_id for n in scheduler_output.scheduled_new_reqs]


# ---- chunked prefill off ----------------------------------------------------------------

def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    scheduler = make_scheduler(max_num_batched_tokens=10, enable_chunked_prefill=False)
    running = make_request(num_tokens=4, max_tokens=3)
    scheduler.add_request(running)
    sample_step(scheduler, scheduler.schedule())
    long, short = make_request(num_tokens=10), make_request(num_tokens=2)
    scheduler.add_request(long)
    scheduler.add_request(short)
    # 9 tokens of budget left: the 10-token prompt is not split, and the one behind it waits its turn
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {running.request_id: 1}
    assert long.status == short.status == RequestStatus.WAITING
    sample_step(scheduler, so)
    sample_step(scheduler, scheduler.schedule())  # the running request's last token
    assert running.is_finished
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {long.request_id: 10}  # whole, in one step; the short one next
    assert short.status == RequestStatus.WAITING


def test_with_chunked_prefill_the_same_prompt_is_split():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    running = make_request(num_tokens=4, max_tokens=3)
    scheduler.add_request(running)
    sample_step(scheduler, scheduler.schedule())
    long = make_request(num_tokens=10)
    scheduler.add_request(long)
    assert scheduler.schedule().num_scheduled_tokens == {running.request_id: 1, long.request_id: 9}


def test_without_chunked_prefill_a_prompt_longer_than_the_budget_still_runs():
    scheduler = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    request = make_request(num_tokens=20, max_tokens=1)
    scheduler.add_request(request)
    chunks = []
    while not request.is_finished:
        so = scheduler.schedule()
        chunks.append(so.num_scheduled_tokens[request.request_id])
        sample_step(scheduler, so)
    assert chunks == [8, 8, 4]


# ---- prefix caching ---------------------------------------------------------------------

def test_prefix_caching_off_recomputes_a_repeated_prompt():
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=False)
    prompt = list(range(10, 23))
    first = make_request(token_ids=prompt, max_tokens=1)
    scheduler.add_request(first)
    sample_step(scheduler, scheduler.schedule())
    second = make_request(token_ids=prompt, max_tokens=1)
    scheduler.add_request(second)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {second.request_id: 13}
    assert second.counters.num_cached_tokens == 0 and so.scheduled_new_reqs[0].num_computed_tokens == 0
    pool = scheduler.kv_cache_manager.pool
    assert pool.num_cached_blocks == 0 and pool.num_hits == 0


def test_reset_prefix_cache_forgets_finished_prompts_and_spares_running_requests():
    scheduler = make_scheduler(block_size=4)
    prompt = list(range(10, 23))  # 3 full blocks + 1
    first = make_request(token_ids=prompt, max_tokens=1)
    holder = make_request(token_ids=list(range(40, 49)), max_tokens=4)  # still running at the reset
    scheduler.add_request(first)
    scheduler.add_request(holder)
    sample_step(scheduler, scheduler.schedule())
    pool = scheduler.kv_cache_manager.pool
    assert first.is_finished and pool.num_cached_blocks == 5
    holder_blocks = scheduler.kv_cache_manager.get_block_ids(holder.request_id)
    free_before = pool.num_free_blocks
    pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == free_before
    again = make_request(token_ids=prompt, max_tokens=1)
    scheduler.add_request(again)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {holder.request_id: 1, again.request_id: 13}
    assert again.counters.num_cached_tokens == 0
    assert scheduler.kv_cache_manager.get_block_ids(holder.request_id) == holder_blocks  # untouched


# ---- preemption -------------------------------------------------------------------------

def test_a_request_that_is_last_preempts_itself():
    scheduler = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks
    older = make_request(num_tokens=7, max_tokens=3)  # 8 tokens after one sample: 2 blocks, full
    newer = make_request(num_tokens=4, max_tokens=3)  # 5 after one sample: needs a 2nd block
    older.arrival_time, newer.arrival_time = 1.0, 2.0
    scheduler.add_request(older)
    scheduler.add_request(newer)
    sample_step(scheduler, scheduler.schedule())
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    so = scheduler.schedule()
    assert newer.status == RequestStatus.PREEMPTED and so.preempted_req_ids == {newer.request_id}
    assert older.status == RequestStatus.RUNNING and so.num_scheduled_tokens == {older.request_id: 1}
    assert scheduler.kv_cache_manager.num_free_blocks == 1
    assert scheduler.running == [older] and scheduler.waiting == [newer]
    sample_step(scheduler, so)
    # the older request takes the freed block as it grows; the newer one resumes once it has finished
    while not older.is_finished:
        so = scheduler.schedule()
        assert newer.request_id not in so.num_scheduled_tokens
        sample_step(scheduler, so)
    so = scheduler.schedule()
    assert admitted(so) == [newer.request_id] and so.scheduled_new_reqs[0].token_ids == newer.all_token_ids
    assert so.num_scheduled_tokens[newer.request_id] + so.scheduled_new_reqs[0].num_computed_tokens == 5


def test_no_waiting_request_is_admitted_in_a_step_that_preempted():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    older, newer = make_request(num_tokens=7), make_request(num_tokens=4)
    older.arrival_time, newer.arrival_time = 1.0, 2.0
    scheduler.add_request(older)
    scheduler.add_request(newer)
    sample_step(scheduler, scheduler.schedule())
    tiny = make_request(num_tokens=1)
    scheduler.add_request(tiny)  # would fit in the block the preemption frees
    so = scheduler.schedule()
    assert so.preempted_req_ids == {newer.request_id}
    assert admitted(so) == [] and tiny.status == RequestStatus.WAITING


def test_the_lowest_priority_running_request_is_preempted_not_the_newest():
    scheduler = make_scheduler(num_blocks=7, block_size=4)  # 6 usable blocks
    urgent, background, latest = (make_request(num_tokens=7, max_tokens=8) for _ in range(3))
    urgent.arrival_time, background.arrival_time, latest.arrival_time = 1.0, 2.0, 3.0
    background.priority = 1  # a larger value is a lower priority
    scheduler.add_request(urgent)
    scheduler.add_request(background)
    sample_step(scheduler, scheduler.schedule())
    scheduler.add_request(latest)  # admitted after the low-priority one
    sample_step(scheduler, scheduler.schedule())
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    so = scheduler.schedule()  # urgent (9 tokens) needs a third block
    assert so.preempted_req_ids == {background.request_id}
    assert background.status == RequestStatus.PREEMPTED
    assert so.num_scheduled_tokens == {urgent.request_id: 1, latest.request_id: 1}


def test_among_equal_priorities_the_newest_arrival_is_preempted():
    scheduler = make_scheduler(num_blocks=7, block_size=4)  # 6 usable blocks
    first, second, third = (make_request(num_tokens=7, max_tokens=8) for _ in range(3))
    for t, r in enumerate((first, second, third)):
        r.arrival_time = float(t)
        scheduler.add_request(r)
    sample_step(scheduler, scheduler.schedule())
    # the oldest request was preempted earlier and is admitted again last: arrival, not admission, counts
    scheduler.running.remove(first)
    scheduler._preempt(first)
    sample_step(scheduler, scheduler.schedule())
    assert scheduler.running == [first, second, third]
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    so = scheduler.schedule()  # everyone needs a third block
    assert so.preempted_req_ids == {third.request_id}
    assert so.num_scheduled_tokens == {first.request_id: 1, second.request_id: 1}


def test_a_lower_priority_request_never_preempts_a_higher_priority_one():
    scheduler = make_scheduler(num_blocks=4, block_size=4)  # 3 usable
    background = make_request(num_tokens=3, max_tokens=8)
    urgent = make_request(num_tokens=7, max_tokens=8)
    background.priority, urgent.priority = 1, 0
    background.arrival_time, urgent.arrival_time = 1.0, 2.0
    scheduler.add_request(background)
    sample_step(scheduler, scheduler.schedule())
    scheduler.add_request(urgent)  # admitted after the low-priority one
    sample_step(scheduler, scheduler.schedule())
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    assert scheduler.running == [urgent, background]
    so = scheduler.schedule()  # background (5 tokens) needs a second block: only it may give one up
    assert so.preempted_req_ids == {background.request_id}
    assert urgent.status == RequestStatus.RUNNING and so.num_scheduled_tokens == {urgent.request_id: 1}
