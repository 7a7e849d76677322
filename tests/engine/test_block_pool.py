"""BlockPool on its own: the free list, reference counts, the prefix-cache index and LRU eviction."""
from __future__ import annotations

import pytest

from engine.kv_cache.block_pool import BlockPool, hash_block


def cached_blocks(pool: BlockPool, *token_runs: tuple[int, ...]):
    """Allocate one block per run of tokens, cache it under a chain of hashes, return (blocks, keys)."""
    blocks = pool.allocate(len(token_runs))
    keys, parent = [], None
    for block, tokens in zip(blocks, token_runs):
        key, block_hash = hash_block(parent, tokens)
        pool.cache_full_block(block, key, block_hash)
        keys.append(key)
        parent = block_hash
    return blocks, keys


def test_needs_two_blocks():
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_allocate_hands_out_fresh_blocks_never_block_0():
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4
    blocks = pool.allocate(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.num_free_blocks == 0
    with pytest.raises(RuntimeError, match="asked for 1 blocks, 0 free"):
        pool.allocate(1)


def test_allocate_is_first_in_first_out_over_the_free_list():
    pool = BlockPool(5)
    assert [b.block_id for b in pool.allocate(2)] == [1, 2]
    a, b = pool.allocate(2)
    pool.free([b, a])  # b freed first: it is reused first
    assert [x.block_id for x in pool.allocate(2)] == [b.block_id, a.block_id]


def test_touch_adds_a_reference_to_a_block_in_use():
    pool = BlockPool(4)
    (block,), (key,) = cached_blocks(pool, (1, 2))
    assert pool.lookup(key) is block
    pool.touch([block])  # a second request hits the prefix while the first still holds it
    assert block.ref_cnt == 2
    assert pool.num_hits == 1
    pool.free([block])
    assert block.ref_cnt == 1 and pool.num_free_blocks == 2  # still held: not on the free list
    pool.free([block])
    assert block.ref_cnt == 0 and pool.num_free_blocks == 3
    pool.touch([block, *pool.allocate(1)])
    assert pool.num_hits == 3  # counted over every call


def test_touch_takes_a_free_cached_block_off_the_free_list():
    pool = BlockPool(4)
    (block,), (key,) = cached_blocks(pool, (1, 2))
    pool.free([block])
    assert pool.num_free_blocks == 3 and pool.lookup(key) is block  # free, still cached
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.num_free_blocks == 2
    others = pool.allocate(2)
    assert block not in others  # a referenced block is never handed out again
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_eviction_takes_the_least_recently_freed_cached_block_first():
    pool = BlockPool(4)  # 3 usable blocks
    (old, middle, new), keys = cached_blocks(pool, (1,), (2,), (3,))
    for block in (old, middle, new):  # freed oldest first
        pool.free([block])
    assert pool.num_cached_blocks == 3
    (fresh,) = pool.allocate(1)
    assert fresh is old
    assert fresh.block_key is None and fresh.block_hash is None  # evicted: no longer a prefix
    assert pool.lookup(keys[0]) is None
    assert pool.lookup(keys[1]) is middle and pool.lookup(keys[2]) is new
    assert pool.num_cached_blocks == 2
    (second,) = pool.allocate(1)
    assert second is middle and pool.lookup(keys[2]) is new


def test_a_reused_block_freed_again_is_evicted_last():
    pool = BlockPool(4)
    (a, b), keys = cached_blocks(pool, (1,), (2,))
    pool.free([a])
    pool.free([b])
    pool.touch([a])  # reused, then freed again: now the most recently freed
    pool.free([a])
    (c,) = pool.allocate(1)  # the third, never-cached block comes first in the free list
    assert c not in (a, b)
    (d,) = pool.allocate(1)
    assert d is b and pool.lookup(keys[0]) is a


def test_the_first_block_cached_under_a_key_is_kept():
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    key, block_hash = hash_block(None, (5, 6))
    pool.cache_full_block(first, key, block_hash)
    pool.cache_full_block(second, key, block_hash)  # the same prefix computed twice at once
    assert pool.lookup(key) is first
    assert second.block_key is None and pool.num_cached_blocks == 1
    other_key, other_hash = hash_block(None, (7, 8))
    pool.cache_full_block(first, other_key, other_hash)  # an already cached block keeps its key
    assert first.block_key == key and pool.lookup(other_key) is None


def test_hash_chain_keys_depend_on_the_parent():
    key_a, hash_a = hash_block(None, (1, 2))
    key_b, hash_b = hash_block(hash_a, (3, 4))
    key_c, _ = hash_block(None, (3, 4))  # the same tokens without the parent: another prefix
    assert key_b == (hash_a, (3, 4)) and hash_b == hash(key_b)
    assert key_b != key_c
    assert hash_block(None, (1, 2)) == (key_a, hash_a)  # deterministic


def test_caching_off_keeps_no_index():
    pool = BlockPool(4, enable_caching=False)
    (block,), (key,) = cached_blocks(pool, (1, 2))
    assert block.block_key is None and pool.num_cached_blocks == 0
    assert pool.lookup(key) is None


def test_reset_prefix_cache_forgets_every_prefix_and_keeps_the_accounting():
    pool = BlockPool(5)
    (a, b), keys = cached_blocks(pool, (1,), (2,))
    pool.free([b])  # a stays in use, b is free and cached
    pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0
    assert pool.lookup(keys[0]) is None and pool.lookup(keys[1]) is None
    assert a.block_key is None and b.block_key is None and a.block_hash is None
    assert a.ref_cnt == 1 and pool.num_free_blocks == 3
    # a forgotten prefix can be cached again
    key, block_hash = hash_block(None, (1,))
    pool.cache_full_block(a, key, block_hash)
    assert pool.lookup(key) is a
