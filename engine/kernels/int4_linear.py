"""4-bit linear layers on CPU: a GGUF file's Q4_0 / Q4_1 / Q4_K weights under `--quantization int8`,
multiplied as they are stored, through the kernels' 4-bit GEMM (engine/kernels/csrc/int4_gemm.cpp).

Every value of the three types is nib * d + m, nib in 0..15, with one fp32 d and m per output
channel and group of 32 values of K (engine/models/gguf_blocks.py decodes the blocks): held once in
the GEMM's layout (int4_gemm.h), 0.75 bytes a value where int8 with per-channel scales takes 1.
Each call quantizes x per token and group of 32 values, as Int8Linear does; the int32 sums of
q * nib are exact and every kernel (AVX-512 VNNI, AVX2, portable, AMX tiles from 32 rows) scales
them by the same fp32 operations, so a row's output does not depend on the other rows of the batch.
"""
from __future__ import annotations

import torch

from engine.kernels.quantized_linear import QuantizedLinear, tensor_bytes

BLOCK_COLUMNS = 16  # output columns per block of the layout
GROUP = 32  # values of K per d, m and per activation scale
K_ALIGN = 64  # K padded to a multiple of this
CHUNK_VALUES = 8  # values of K per column in one 64-byte chunk: low nibbles 4, high nibbles the next 4


class Int4Linear(QuantizedLinear):
    """y = x @ W.T + b with W held once as 4-bit nibbles plus fp32 d and m per 32 values."""

    format = "int4"

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, out_features: int, in_features: int,
                 bias: torch.Tensor | None, dtype: torch.dtype, kernels) -> None:
        super().__init__(packed, scales, out_features, in_features, bias, dtype, kernels)
        groups = -(-in_features // GROUP)
        # what a forward reads: the nibbles, their d and m, the bias (roofline figures)
        self.weight_bytes = out_features * (-(-in_features // 2) + 8 * groups) + tensor_bytes(self.bias)

    @classmethod
    def from_nibbles(cls, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype,
                     kernels) -> Int4Linear:
        """W = nibbles * d + m: nibbles uint8 [N, K] (0..15), d and m fp32 [N, K / 32], per 32 values."""
        out_features, in_features = nibbles.shape
        if in_features % GROUP or d.shape != (out_features, in_features // GROUP) or m.shape != d.shape:
            raise ValueError(f"4-bit weight: nibbles {tuple(nibbles.shape)} need d and m of "
                             f"[{out_features}, {in_features // GROUP}], got {tuple(d.shape)}, {tuple(m.shape)}")
        blocks = -(-out_features // BLOCK_COLUMNS)
        padded_k = -(-in_features // K_ALIGN) * K_ALIGN
        values = torch.zeros(blocks * BLOCK_COLUMNS, padded_k, dtype=torch.uint8)
        values[:out_features, :in_features] = nibbles
        # [block, column, chunk, low / high, 4] -> [block, chunk, column, 4]: low | high << 4
        values = values.view(blocks, BLOCK_COLUMNS, padded_k // CHUNK_VALUES, 2, 4).permute(0, 2, 1, 3, 4)
        packed = (values[..., 0, :] | (values[..., 1, :] << 4)).contiguous()
        scales = torch.zeros(2, blocks * BLOCK_COLUMNS, padded_k // GROUP, dtype=torch.float32)
        scales[0, :out_features, :d.shape[1]] = d
        scales[1, :out_features, :d.shape[1]] = m
        # [d / m, block, column, group] -> [block, group, d / m, column]
        scales = scales.view(2, blocks, BLOCK_COLUMNS, -1).permute(1, 3, 0, 2).contiguous()
        return cls(packed, scales, out_features, in_features, None, dtype, kernels)

    def multiply(self, x: torch.Tensor, fp32_out: bool) -> torch.Tensor:
        return self.kernels.int4_gemm(x, self.packed_weight, self.scales, self.out_features, self.bias, fp32_out)

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as nib * d + m, in float32."""
        ids = ids.long()
        blocks, columns = ids // BLOCK_COLUMNS, ids % BLOCK_COLUMNS
        chunks = self.packed_weight[blocks, :, columns, :]  # [*ids, chunks, 4]
        nibbles = torch.stack((chunks & 0x0F, chunks >> 4), dim=-2).reshape(*ids.shape, -1)
        scales = self.scales[blocks, :, :, columns]  # [*ids, groups, 2]
        d, m = (scales[..., i].repeat_interleave(GROUP, dim=-1) for i in (0, 1))
        k = self.in_features
        return nibbles[..., :k].float() * d[..., :k] + m[..., :k]
