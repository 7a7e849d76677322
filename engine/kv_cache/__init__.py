"""The paged KV cache's blocks: the pool, prefix caching, per-request block tables."""
