"""Attention over the paged KV cache: the backend interface (base.py) and the choice of backend.

CPU: Formwork's kernel (cpu.py). CUDA: flash-attn when installed and usable with the cache's
block size (flash.py), else torch SDPA over the same cache (sdpa.py), with a warning saying why.
"""
from __future__ import annotations

import logging

import torch

from engine.attention.base import DEFAULT_OPTIONS, AttentionBackend, AttentionInputs, AttentionOptions, write_kv

__all__ = ["DEFAULT_OPTIONS", "AttentionBackend", "AttentionInputs", "AttentionOptions", "get_attention_backend",
           "write_kv"]

logger = logging.getLogger(__name__)


def get_attention_backend(device: torch.device, block_size: int = 16, cuda_choice: str = "auto") -> AttentionBackend:
    """The backend for `device`. On CUDA, `cuda_choice` is CudaConfig.attention_backend: flash-attn
    when usable ("auto"), flash-attn or a ValueError saying what to change ("flash_attn"), or torch
    SDPA ("torch")."""
    if device.type != "cuda":
        from engine.attention.cpu import CpuAttentionBackend
        return CpuAttentionBackend()
    from engine.attention.sdpa import SdpaAttentionBackend
    if cuda_choice == "torch":
        return SdpaAttentionBackend()
    from engine.attention.flash import FlashAttentionBackend, load_flash_attn
    flash_attn, problem = load_flash_attn(block_size)
    if flash_attn is not None:
        return FlashAttentionBackend(flash_attn)
    if cuda_choice == "flash_attn":
        raise ValueError(f"attention_backend='flash_attn' is not usable: {problem}; "
                         "or use attention_backend='torch'")
    logger.warning("CUDA attention falls back to torch SDPA over the paged cache (slower on long contexts): %s",
                   problem)
    return SdpaAttentionBackend()
