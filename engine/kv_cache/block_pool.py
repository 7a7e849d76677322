"""The pool of KV-cache blocks: free list, reference counts, and the prefix-cache index.

A block is either in use (ref_cnt > 0) or free. A free block may still hold a cached prefix
(it keeps its hash); it is then reusable by a prefix-cache hit until it is evicted, which happens
least-recently-freed first when a fresh block is needed.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# A cache key is exact: the parent block's hash plus this block's tokens, so equal keys mean
# equal token prefixes (the dict compares the tuple, not only its hash).
BlockKey = tuple[int | None, tuple[int, ...]]


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_key: BlockKey | None = None  # set once the block is full and cached
    block_hash: int | None = None  # hash(block_key), the parent link of the next block

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_key is not None})"


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> tuple[BlockKey, int]:
    key: BlockKey = (parent_hash, token_ids)
    return key, hash(key)


class BlockPool:
    """Owns every block. Block 0 is never handed out: padded slots may point at it safely."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # free blocks in eviction order (oldest freed first); id -> block
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[BlockKey, KVCacheBlock] = {}
        self.num_hits = 0  # prefix-cache hits, in blocks (monitoring and tests)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def lookup(self, block_key: BlockKey) -> KVCacheBlock | None:
        return self._cached.get(block_key) if self.enable_caching else None

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` fresh blocks (evicting cached free ones), each with ref_cnt 1."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        out = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            if block.block_key is not None:  # evict: its prefix is no longer reusable
                del self._cached[block.block_key]
                block.block_key = block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, removing free ones from the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1
        self.num_hits += len(blocks)

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching zero become free (still cached).

        Callers pass a request's blocks in reverse order so that the tail of a prefix is
        evicted before its head (the head is the part other requests are likeliest to share).
        """
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache_full_block(self, block: KVCacheBlock, block_key: BlockKey, block_hash: int) -> None:
        if not self.enable_caching or block.block_key is not None:
            return
        if block_key in self._cached:  # same prefix computed twice concurrently: keep the first
            return
        block.block_key, block.block_hash = block_key, block_hash
        self._cached[block_key] = block

    def reset_prefix_cache(self) -> None:
        for block in self._cached.values():
            block.block_key = block.block_hash = None
        self._cached.clear()
