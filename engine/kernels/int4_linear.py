"""4-bit linear layers on CPU: a GGUF file's Q4_0 / Q4_1 / Q4_K weights under `--quantization int8`,
multiplied as they are stored, through the kernels' 4-bit GEMM (engine/kernels/csrc/int4_gemm.cpp).

Every value of the three types is nib * d + m, nib in 0..15, with one d and m per output channel
and group of 32 values of K (engine/models/gguf_blocks.py decodes the blocks), held as fp16, as the
files store them (Q4_0's m = -8 d too; Q4_K's d * sub-scale and dmin * sub-min products are rounded
to fp16): held once in the GEMM's layout (int4_gemm.h), 0.625 bytes a value where int8 with
per-channel scales takes 1. Each call quantizes x per token and group of 32 values, as Int8Linear
does; the int32 sums of q * nib are exact and every kernel (AVX-512 VNNI, AVX2, portable, AMX tiles
from 32 rows) widens d and m to fp32 and scales the sums by the same fp32 operations, so a row's
output does not depend on the other rows of the batch.
"""
from __future__ import annotations

import torch

from engine.kernels.quantized_linear import QuantizedLinear, tensor_bytes

BLOCK_COLUMNS = 16  # output columns per block of the layout
GROUP = 32  # values of K per d, m and per activation scale
K_ALIGN = 64  # K padded to a multiple of this
CHUNK_VALUES = 8  # values of K per column in one 64-byte chunk: low nibbles 4, high nibbles the next 4


class Int4Linear(QuantizedLinear):
    """y = x @ W.T + b with W held once as 4-bit nibbles plus fp16 d and m per 32 values."""

    format = "int4"

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, out_features: int, in_features: int,
                 bias: torch.Tensor | None, dtype: torch.dtype, kernels) -> None:
        super().__init__(packed, scales, out_features, in_features, bias, dtype, kernels)
        groups = -(-in_features // GROUP)
        # what a forward reads: the nibbles, their d and m, the bias (roofline figures)
        self.weight_bytes = (out_features * (-(-in_features // 2) + 2 * groups * self.scales.element_size())
                             + tensor_bytes(self.bias))

    @classmethod
    def from_nibbles(cls, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype,
                     kernels) -> Int4Linear:
        """W = nibbles * d + m: nibbles uint8 [N, K] (0..15), d and m float [N, K / 32], per 32 values (held
        as fp16)."""
        layer = cls.zeros(nibbles.shape[0], nibbles.shape[1], dtype, kernels)
        layer.set_rows(0, nibbles, d, m)
        return layer

    @classmethod
    def zeros(cls, out_features: int, in_features: int, dtype: torch.dtype, kernels) -> Int4Linear:
        """W = 0 in the layout, its rows to be filled by set_rows (a loader decodes a few at a time)."""
        if in_features % GROUP:
            raise ValueError(f"4-bit weight: K = {in_features} is not a multiple of {GROUP}")
        blocks = -(-out_features // BLOCK_COLUMNS)
        padded_k = -(-in_features // K_ALIGN) * K_ALIGN
        packed = torch.zeros(blocks, padded_k // CHUNK_VALUES, BLOCK_COLUMNS, 4, dtype=torch.uint8)
        scales = torch.zeros(blocks, padded_k // GROUP, 2, BLOCK_COLUMNS, dtype=torch.float16)
        return cls(packed, scales, out_features, in_features, None, dtype, kernels)

    def set_rows(self, start: int, nibbles: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> None:
        """Rows [start, start + R) of W = nibbles * d + m: nibbles uint8 [R, K] (0..15), d and m float
        [R, K / 32], rounded to fp16 (exact for the files' own fp16 values)."""
        count, in_features = nibbles.shape
        groups = in_features // GROUP
        if (in_features != self.in_features or d.shape != (count, groups) or m.shape != d.shape
                or not 0 <= start <= self.out_features - count):
            raise ValueError(f"4-bit weight [{self.out_features}, {self.in_features}]: rows {start}.. of nibbles "
                             f"{tuple(nibbles.shape)} need d and m of [{count}, {groups}], got {tuple(d.shape)}, "
                             f"{tuple(m.shape)}")
        padded_k = self.packed_weight.shape[1] * CHUNK_VALUES
        values = torch.zeros(count, padded_k, dtype=torch.uint8)
        values[:, :in_features] = nibbles
        # [row, chunk, low / high, 4] -> [row, chunk, 4]: low | high << 4
        values = values.view(count, padded_k // CHUNK_VALUES, 2, 4)
        chunks = values[:, :, 0] | (values[:, :, 1] << 4)
        rows = torch.arange(start, start + count)
        blocks, columns = rows // BLOCK_COLUMNS, rows % BLOCK_COLUMNS
        # the layout [block, chunk, column, 4] and [block, group, d / m, column] seen per block and column
        self.packed_weight.permute(0, 2, 1, 3)[blocks, columns] = chunks
        self.scales.permute(0, 3, 1, 2)[blocks, columns, :groups] = torch.stack((d.half(), m.half()), dim=-1)

    def multiply(self, x: torch.Tensor, fp32_out: bool) -> torch.Tensor:
        return self.kernels.int4_gemm(x, self.packed_weight, self.scales, self.out_features, self.bias, fp32_out)

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as nib * d + m, in float32."""
        ids = ids.long()
        blocks, columns = ids // BLOCK_COLUMNS, ids % BLOCK_COLUMNS
        chunks = self.packed_weight[blocks, :, columns, :]  # [*ids, chunks, 4]
        nibbles = torch.stack((chunks & 0x0F, chunks >> 4), dim=-2).reshape(*ids.shape, -1)
        scales = self.scales[blocks, :, :, columns].float()  # [*ids, groups, 2]
        d, m = (scales[..., i].repeat_interleave(GROUP, dim=-1) for i in (0, 1))
        k = self.in_features
        return nibbles[..., :k].float() * d[..., :k] + m[..., :k]
