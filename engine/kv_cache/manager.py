"""Per-request block tables on top of the BlockPool, with prefix caching."""
from __future__ import annotations

from typing import Protocol

from engine.kv_cache.block_pool import BlockPool, KVCacheBlock, hash_block


class RequestTokens(Protocol):
    """What the cache reads of a request (the scheduler's Request): its id and its tokens."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> list[int]: ...

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...


class KVCacheManager:
    """Maps each request to the blocks holding its KV.

    Invariant: a request's blocks cover at least its `num_computed_tokens` (plus whatever was
    allocated for the tokens scheduled this step); full blocks whose tokens are known are in the
    prefix-cache index.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # req_id -> hashes of its full blocks so far (the chain, extended as blocks fill)
        self._req_block_hashes: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def get_computed_blocks(self, request: RequestTokens) -> tuple[list[KVCacheBlock], int]:
        """Prefix-cache hits for a request about to be scheduled from scratch.

        Returns the hit blocks (not yet referenced) and the number of tokens they cover. At least
        the last token is always left to compute: its logits are needed.
        """
        if not self.pool.enable_caching:
            return [], 0
        hits: list[KVCacheBlock] = []
        parent: int | None = None
        token_ids = request.all_token_ids
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        for i in range(max_hit_blocks):
            key, block_hash = hash_block(parent, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            block = self.pool.lookup(key)
            if block is None:
                break
            hits.append(block)
            parent = block_hash
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: RequestTokens, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens after `num_computed_tokens` (+ the hits).

        Returns the newly allocated blocks, or None (and changes nothing) if the pool is short.
        Caches the blocks that become full with this step's tokens.
        """
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        hits = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(hits) * self.block_size
        num_needed = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = num_needed - len(blocks) - len(hits)
        # hit blocks that sit free must leave the free list, which shrinks what is left to allocate
        num_free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_free_hits:
            return None
        if hits:
            self.pool.touch(hits)
            blocks.extend(hits)
            self._req_block_hashes[request.request_id] = [b.block_hash for b in hits]  # type: ignore[misc]
        new_blocks = self.pool.allocate(num_new_blocks) if num_new_blocks > 0 else []
        blocks.extend(new_blocks)
        self._cache_full_blocks(request, num_computed + num_new_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: RequestTokens, num_tokens: int) -> None:
        if not self.pool.enable_caching:
            return
        hashes = self._req_block_hashes.setdefault(request.request_id, [])
        blocks = self.req_to_blocks[request.request_id]
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        token_ids = request.all_token_ids
        for i in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else None
            key, block_hash = hash_block(parent, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            self.pool.cache_full_block(blocks[i], key, block_hash)
            hashes.append(block_hash)

    def free(self, request: RequestTokens) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._req_block_hashes.pop(request.request_id, None)
        self.pool.free(list(reversed(blocks)))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
