"""llguidance's token masks in torch tensors: what llguidance.torch offers for this, without importing
it (that module compiles a function with torch.compile when imported, which loads torch._dynamo:
seconds of every engine start, for two lines Formwork needs)."""
from __future__ import annotations

import llguidance as llg
import torch


def allocate_token_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """[num_rows, ceil(vocab_size / 32)] int32, every bit set (every token allowed)."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def fill_next_token_bitmask(matcher: llg.LLMatcher, bitmask: torch.Tensor, row: int) -> None:
    """The matcher's allowed next tokens into bitmask[row]: llguidance writes through the row's
    pointer, so the row must be the CPU int32 memory it claims to be."""
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
        raise ValueError(f"a token bitmask is 2-D int32 on the CPU, not {bitmask.dtype} {list(bitmask.shape)} "
                         f"on {bitmask.device}")
    target = bitmask[row]
    if not target.is_contiguous():
        raise ValueError("a token bitmask's rows must be contiguous")
    matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())
