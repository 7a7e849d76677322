"""KVCacheManager on its own: block tables, prefix hits along the hash chain, and free-block accounting."""
from __future__ import annotations

from conftest import make_request, make_scheduler, sample_step

from engine.kv_cache.block_pool import hash_block
from engine.kv_cache.manager import KVCacheManager

BLOCK = 4


def admit(manager: KVCacheManager, request, num_new: int | None = None):
    """What the scheduler does for a waiting request: look up hits, allocate, advance."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    num_new = request.num_tokens - num_hit_tokens if num_new is None else num_new
    new_blocks = manager.allocate_slots(request, num_new, hits)
    if new_blocks is not None:
        request.num_computed_tokens = num_hit_tokens + num_new
    return hits, new_blocks


def test_allocate_slots_covers_the_tokens_and_grows_by_whole_blocks():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    request = make_request(num_tokens=6)
    _, new_blocks = admit(manager, request)
    assert len(new_blocks) == 2 and manager.num_free_blocks == 5
    assert manager.get_block_ids(request.request_id) == [b.block_id for b in new_blocks]
    request.append_output_token_ids([7, 8])  # 8 tokens: still two blocks
    assert manager.allocate_slots(request, 2) == []
    request.num_computed_tokens = 8
    request.append_output_token_ids([9])
    assert len(manager.allocate_slots(request, 1)) == 1
    assert manager.num_free_blocks == 4
    assert manager.pool.num_free_blocks == (manager.pool.num_blocks - 1) - 3  # 3 of the 7 usable blocks held


def test_allocate_slots_changes_nothing_when_short():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK)  # 3 usable
    request = make_request(num_tokens=13)  # needs 4
    assert manager.allocate_slots(request, 13) is None
    assert manager.num_free_blocks == 3
    assert manager.get_block_ids(request.request_id) == []
    assert manager.pool.num_cached_blocks == 0


def test_only_full_blocks_are_cached_along_a_chain():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    request = make_request(token_ids=list(range(100, 110)))  # 2 full blocks + 2 tokens
    admit(manager, request)
    assert manager.pool.num_cached_blocks == 2
    blocks = manager.req_to_blocks[request.request_id]
    key0, hash0 = hash_block(None, (100, 101, 102, 103))
    key1, _ = hash_block(hash0, (104, 105, 106, 107))
    assert manager.pool.lookup(key0) is blocks[0] and manager.pool.lookup(key1) is blocks[1]
    assert blocks[2].block_key is None
    # a chunk that fills the third block caches it, chained on the second
    request.append_output_token_ids([110, 111])
    manager.allocate_slots(request, 2)
    assert blocks[2].block_key == (blocks[1].block_hash, (108, 109, 110, 111))


def test_hits_follow_the_chain_and_add_references():
    manager = KVCacheManager(num_blocks=16, block_size=BLOCK)
    first = make_request(token_ids=list(range(100, 113)))  # 3 full blocks + 1
    admit(manager, first)
    second = make_request(token_ids=list(range(100, 108)) + [1, 2, 3, 4, 5])  # shares 2 blocks, then differs
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 8 and hits == manager.req_to_blocks[first.request_id][:2]
    assert all(b.ref_cnt == 1 for b in hits)  # a lookup takes no reference
    free_before = manager.num_free_blocks
    _, new_blocks = admit(manager, second)
    assert [b.ref_cnt for b in hits] == [2, 2]
    assert len(new_blocks) == 2 and manager.num_free_blocks == free_before - 2
    # the same tokens under another parent are not a hit: the chain, not the block alone, is the key
    shifted = make_request(token_ids=[1, 2, 3, 4] + list(range(104, 108)) + [9])
    assert manager.get_computed_blocks(shifted) == ([], 0)


def test_a_full_prompt_hit_leaves_the_last_token_to_compute():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    prompt = list(range(100, 108))
    admit(manager, make_request(token_ids=prompt))
    hits, num_hit_tokens = manager.get_computed_blocks(make_request(token_ids=prompt))
    assert num_hit_tokens == 4 and len(hits) == 1


def test_free_hits_count_against_what_can_be_allocated():
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK)  # 4 usable
    first = make_request(token_ids=list(range(100, 109)), max_tokens=1)  # 3 blocks, 2 cached
    admit(manager, first)
    manager.free(first)
    assert manager.num_free_blocks == 4 and manager.pool.num_cached_blocks == 2
    # 2 hits (sitting free) + 3 new blocks: 5 blocks from a pool of 4, so it must not fit
    second = make_request(token_ids=list(range(100, 108)) + list(range(200, 209)))
    hits, new_blocks = admit(manager, second)
    assert len(hits) == 2 and new_blocks is None
    assert manager.num_free_blocks == 4 and all(b.ref_cnt == 0 for b in hits)
    # 2 hits + 2 new fit exactly
    third = make_request(token_ids=list(range(100, 108)) + list(range(300, 305)))
    hits, new_blocks = admit(manager, third)
    assert len(hits) == 2 and len(new_blocks) == 2 and manager.num_free_blocks == 0


def test_free_releases_the_tail_first():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    request = make_request(token_ids=list(range(100, 112)), max_tokens=1)  # 3 full blocks
    admit(manager, request)
    head, middle, tail = manager.req_to_blocks[request.request_id]
    manager.free(request)
    assert manager.get_block_ids(request.request_id) == []
    assert manager.num_free_blocks == 7
    # the 4 never-used blocks come first, then the tail, so a later hit still finds the head
    order = [b.block_id for b in manager.pool.allocate(7)]
    assert order[-3:] == [tail.block_id, middle.block_id, head.block_id]


def test_shared_blocks_stay_in_use_until_the_last_holder_frees_them():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK)
    prompt = list(range(100, 108))
    a, b = make_request(token_ids=prompt + [1]), make_request(token_ids=prompt + [2])
    admit(manager, a)
    admit(manager, b)
    assert manager.num_free_blocks == 7 - 4  # 2 shared + one own block each
    manager.free(a)
    assert manager.num_free_blocks == 7 - 3
    assert [blk.ref_cnt for blk in manager.req_to_blocks[b.request_id]] == [1, 1, 1]
    manager.free(b)
    assert manager.num_free_blocks == 7


def test_caching_off_never_hits():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK, enable_caching=False)
    prompt = list(range(100, 109))
    admit(manager, make_request(token_ids=prompt))
    assert manager.pool.num_cached_blocks == 0
    assert manager.get_computed_blocks(make_request(token_ids=prompt)) == ([], 0)


def test_free_blocks_add_up_after_preemption_and_abort():
    scheduler = make_scheduler(num_blocks=7, block_size=BLOCK, max_num_batched_tokens=64)  # 6 usable
    manager = scheduler.kv_cache_manager
    requests = [make_request(num_tokens=7, max_tokens=20) for _ in range(3)]
    for r in requests:
        scheduler.add_request(r)

    def check():
        held = {b.block_id for r in scheduler.running for b in manager.req_to_blocks[r.request_id]}
        assert manager.num_free_blocks == 6 - len(held)
        for r in scheduler.waiting:
            assert manager.get_block_ids(r.request_id) == []

    while scheduler.num_preemptions == 0:
        sample_step(scheduler, scheduler.schedule())
        check()
    preempted = [r for r in requests if r.num_preemptions]
    assert preempted and all(r in scheduler.waiting for r in preempted)
    scheduler.abort_requests([requests[0].request_id])
    check()
    scheduler.abort_requests([r.request_id for r in requests[1:]])
    assert manager.num_free_blocks == 6 and not manager.req_to_blocks
