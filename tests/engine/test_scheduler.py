"""The catch-up rule, budgets, chunked prefill, preemption and prefix-cache hits, step by step."""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step

from engine.sched.request import RequestStatus
from engine.sched.scheduler_output import ModelRunnerOutput


def test_reference_two_request_example():
    # the write-up's example: prompts of 4 and 2 tokens, a budget of 6, two steps
    scheduler = make_scheduler(max_num_batched_tokens=6, block_size=4, num_blocks=16)
    r1, r2 = make_request(num_tokens=4, request_id="r1"), make_request(num_tokens=2, request_id="r2")
    scheduler.add_request(r1)
    scheduler.add_request(r2)

    step1 = scheduler.schedule()
    assert step1.num_scheduled_tokens == {"r1": 4, "r2": 2}
    assert step1.total_num_scheduled_tokens == 6
    assert [n.req_id for n in step1.scheduled_new_reqs] == ["r1", "r2"]
    assert step1.scheduled_cached_reqs.req_ids == []
    # the scheduler advances its own counters right after planning
    assert (r1.num_computed_tokens, r2.num_computed_tokens) == (4, 2)
    outputs = sample_step(scheduler, step1)
    assert {o.request_id: o.new_token_ids for o in outputs} == {"r1": [100], "r2": [100]}

    step2 = scheduler.schedule()
    assert step2.num_scheduled_tokens == {"r1": 1, "r2": 1}
    assert step2.scheduled_new_reqs == []
    cached = step2.scheduled_cached_reqs
    assert cached.req_ids == ["r1", "r2"]
    assert cached.num_computed_tokens == [4, 2]
    assert cached.new_block_ids == [[scheduler.kv_cache_manager.get_block_ids("r1")[-1]], []]  # r1 crosses a block


def test_token_budget_chunks_a_long_prompt():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    request = make_request(num_tokens=20)
    scheduler.add_request(request)
    chunks = []
    for _ in range(3):
        so = scheduler.schedule()
        chunks.append(so.num_scheduled_tokens[request.request_id])
        outputs = sample_step(scheduler, so)
    assert chunks == [8, 8, 4]
    assert [o.new_token_ids for o in outputs] == [[100]]  # only the last chunk samples


def test_running_requests_come_before_waiting_ones():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    a = make_request(num_tokens=8)
    scheduler.add_request(a)
    sample_step(scheduler, scheduler.schedule())
    b = make_request(num_tokens=20)
    scheduler.add_request(b)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {a.request_id: 1, b.request_id: 9}


def test_max_num_seqs_caps_admission():
    scheduler = make_scheduler(max_num_seqs=2)
    requests = [make_request(num_tokens=4) for _ in range(3)]
    for r in requests:
        scheduler.add_request(r)
    so = scheduler.schedule()
    assert list(so.num_scheduled_tokens) == [r.request_id for r in requests[:2]]
    assert requests[2].status == RequestStatus.WAITING


def test_priority_orders_the_waiting_queue():
    scheduler = make_scheduler(max_num_seqs=1)
    low, high = make_request(num_tokens=4), make_request(num_tokens=4)
    high.priority = -1
    scheduler.add_request(low)
    scheduler.add_request(high)
    assert list(scheduler.schedule().num_scheduled_tokens) == [high.request_id]


def test_preemption_frees_blocks_and_resumes_by_recompute():
    # 5 usable blocks of 4 tokens; two requests of 8 tokens fill 4, then growth forces preemption
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a, b = make_request(num_tokens=8, max_tokens=8), make_request(num_tokens=8, max_tokens=8)
    scheduler.add_request(a)
    scheduler.add_request(b)
    sample_step(scheduler, scheduler.schedule())  # both prefilled (4 blocks used, 1 free), one token each
    # a takes the last free block for its 9th token; b then needs one too: b, the newest, is preempted
    so = scheduler.schedule()
    assert b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert so.num_scheduled_tokens == {a.request_id: 1}
    assert scheduler.kv_cache_manager.get_block_ids(b.request_id) == []
    sample_step(scheduler, so)
    # b comes back as a new request carrying its output so far, once a finishes
    while not a.is_finished:
        so = scheduler.schedule()
        sample_step(scheduler, so)
    so = scheduler.schedule()
    new = {n.req_id: n for n in so.scheduled_new_reqs}
    assert b.request_id in new and b.request_id in so.preempted_req_ids | set(new)
    assert new[b.request_id].token_ids == b.all_token_ids
    assert len(b.all_token_ids) == 8 + 1  # its prompt and the token sampled before preemption


def test_prefix_cache_hit_skips_shared_blocks():
    scheduler = make_scheduler(block_size=4)
    shared = list(range(10, 22))  # three full blocks
    first = make_request(token_ids=shared + [50, 51])
    scheduler.add_request(first)
    sample_step(scheduler, scheduler.schedule())
    second = make_request(token_ids=shared + [60])
    scheduler.add_request(second)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens[second.request_id] == 1  # 12 tokens from the cache
    assert second.counters.num_cached_tokens == 12
    new = [n for n in so.scheduled_new_reqs if n.req_id == second.request_id][0]
    assert new.num_computed_tokens == 12
    assert new.block_ids[:3] == scheduler.kv_cache_manager.get_block_ids(first.request_id)[:3]


def test_full_prompt_hit_still_computes_the_last_token():
    scheduler = make_scheduler(block_size=4)
    prompt = list(range(10, 18))  # exactly two blocks
    a = make_request(token_ids=prompt)
    scheduler.add_request(a)
    sample_step(scheduler, scheduler.schedule())
    b = make_request(token_ids=prompt)
    scheduler.add_request(b)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens[b.request_id] == 4  # the last block is recomputed, not shared
    assert b.counters.num_cached_tokens == 4


def test_freed_cached_blocks_are_reused_then_evicted():
    scheduler = make_scheduler(block_size=4, num_blocks=4)  # 3 usable blocks
    prompt = list(range(10, 19))
    a = make_request(token_ids=prompt, max_tokens=1)
    scheduler.add_request(a)
    sample_step(scheduler, scheduler.schedule())
    assert a.is_finished
    pool = scheduler.kv_cache_manager.pool
    assert pool.num_free_blocks == 3 and pool.num_cached_blocks == 2
    b = make_request(token_ids=prompt, max_tokens=1)
    scheduler.add_request(b)
    so = scheduler.schedule()
    assert b.counters.num_cached_tokens == 8 and so.num_scheduled_tokens[b.request_id] == 1
    sample_step(scheduler, so)
    c = make_request(num_tokens=12, max_tokens=1)  # needs all 3 blocks: evicts the cached ones
    scheduler.add_request(c)
    sample_step(scheduler, scheduler.schedule())
    assert pool.num_cached_blocks == 3  # c's full blocks replaced a's


def test_stops_eos_stop_ids_and_length():
    scheduler = make_scheduler()
    eos = make_request(num_tokens=4)
    stop = make_request(num_tokens=4, stop_token_ids=[7])
    length = make_request(num_tokens=4, max_tokens=2)
    for r in (eos, stop, length):
        scheduler.add_request(r)
    so = scheduler.schedule()
    runner_out = ModelRunnerOutput(list(so.num_scheduled_tokens),
                                   {eos.request_id: [2], stop.request_id: [7], length.request_id: [5]})
    outputs = {o.request_id: o for o in scheduler.update_from_output(so, runner_out)}
    assert eos.status == RequestStatus.FINISHED_STOPPED and outputs[eos.request_id].finish_reason == 0
    assert stop.status == RequestStatus.FINISHED_STOPPED and outputs[stop.request_id].stop_reason == 7
    assert length.status == RequestStatus.RUNNING
    sample_step(scheduler, scheduler.schedule(), token_id=5)
    assert length.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_context_length_caps_output():
    scheduler = make_scheduler(max_model_len=12)
    request = make_request(num_tokens=10, max_tokens=100)
    scheduler.add_request(request)
    for _ in range(2):
        sample_step(scheduler, scheduler.schedule())
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED and request.num_tokens == 12


def test_abort_frees_blocks_in_every_state():
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_request(num_tokens=20), make_request(num_tokens=20)
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    scheduler.schedule()
    free_before = scheduler.kv_cache_manager.num_free_blocks
    scheduler.abort_requests([running.request_id, waiting.request_id])
    assert running.status == waiting.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.kv_cache_manager.num_free_blocks == free_before + 2
    assert not scheduler.has_unfinished_requests()
    so = scheduler.schedule()
    assert so.finished_req_ids == {running.request_id, waiting.request_id}
