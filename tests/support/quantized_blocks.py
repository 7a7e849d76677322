"""Random GGUF blocks of llama.cpp's quantized types, as a file holds them: random bytes, with
finite fp16 scales of a weight's size where the type keeps them (d, m, dmin)."""
from __future__ import annotations

import numpy as np
import torch

# type -> (values per block, bytes per block, byte offsets of its fp16 scales, how many of them are positive)
LAYOUTS = {"Q4_0": (32, 18, (0,), 1), "Q4_1": (32, 20, (0, 2), 1), "Q4_K": (256, 144, (0, 2), 2),
           "Q6_K": (256, 210, (208,), 1)}


def random_blocks(tensor_type: str, num_rows: int, in_features: int, seed: int = 0, scale: float = 0.01
                  ) -> torch.Tensor:
    """uint8 [num_rows, bytes per row] of tensor_type's blocks."""
    rng = np.random.default_rng(seed)
    values, size, offsets, positive = LAYOUTS[tensor_type]
    blocks = rng.integers(0, 256, (num_rows, in_features // values, size), dtype=np.uint8)
    for i, offset in enumerate(offsets):
        half = (rng.standard_normal((num_rows, in_features // values)) * scale).astype(np.float16)
        if i < positive:  # llama.cpp's d and dmin are positive
            half = np.abs(half)
        blocks[..., offset:offset + 2] = half[..., None].view(np.uint8)
    return torch.from_numpy(blocks.reshape(num_rows, -1))
