"""Whether a request fits the engine: its context length and its whole KV cache.

One check for both edges: the service applies it before a request crosses to the engine (and
answers INVALID_ARGUMENT or RESOURCE_EXHAUSTED), the engine core again to whatever reaches it
(the offline LLM, or a front end that skipped the check).
"""
from __future__ import annotations


class PromptTooLong(ValueError):
    """The prompt fills the context length: there is no room to generate."""


class KVCacheTooSmall(ValueError):
    """The request would not fit even in the whole, empty KV cache, so it would preempt itself forever."""


def check_context_length(num_prompt_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens >= max_model_len:
        raise PromptTooLong(f"the prompt has {num_prompt_tokens} tokens; the context length is {max_model_len} "
                            f"tokens (prompt + output), which leaves no room to generate")


def check_kv_capacity(num_prompt_tokens: int, max_tokens: int, max_model_len: int, num_blocks: int,
                      block_size: int) -> None:
    """num_blocks: the KV blocks a request can use (the pool's, less the null block)."""
    kv_tokens = num_blocks * block_size
    num_tokens = min(num_prompt_tokens + max_tokens, max_model_len)
    if num_tokens > kv_tokens:
        raise KVCacheTooSmall(
            f"the request needs KV cache for up to {num_tokens} tokens (prompt {num_prompt_tokens} + max_tokens "
            f"{max_tokens}, within the context length {max_model_len}), but the engine's KV cache holds "
            f"{kv_tokens} tokens ({num_blocks} blocks of {block_size}); shorten the prompt or lower max_tokens")
