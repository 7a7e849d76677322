"""llama.cpp's 4-bit blocks (Q4_0, Q4_1, Q4_K) decoded to one form: W = nibbles * d + m, nibbles
0..15, one fp32 d and m per row and 32 values (what Int4Linear multiplies by; it holds them as fp16,
exactly for Q4_0 and Q4_1, Q4_K's products rounded).

* Q4_0, 18 bytes per 32 values: fp16 d, then 16 bytes of nibbles (value j in byte j's low half,
  value 16 + j in its high half); w = (nib - 8) d, so m = -8 d.
* Q4_1, 20 bytes per 32 values: fp16 d, fp16 m, the nibbles as Q4_0's; w = nib d + m.
* Q4_K, 144 bytes per 256 values: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins for the 8
  sub-blocks of 32, then 128 bytes of nibbles (per 64 values, 32 bytes: the first sub-block in the
  low halves, the second in the high ones); w = nib (d sc) - dmin mn. d sc and dmin mn are exact in
  fp32 (an fp16 times a 6-bit integer); fp16 rounds them to 11 significant bits.
"""
from __future__ import annotations

import torch

# GGUF type -> (values per block, bytes per block)
BLOCK_SHAPES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}


def row_bytes(tensor_type: str, in_features: int) -> int:
    values, size = BLOCK_SHAPES[tensor_type]
    return in_features // values * size


def decode_four_bit(rows: torch.Tensor, tensor_type: str, in_features: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows: uint8 [N, bytes per row] of tensor_type -> (nibbles uint8 [N, K], d, m fp32 [N, K / 32])."""
    values, size = BLOCK_SHAPES[tensor_type]
    if in_features % values or rows.shape[1] != in_features // values * size:
        raise ValueError(f"{tensor_type} rows of {in_features} values need {in_features // values * size} bytes "
                         f"(K a multiple of {values}), got {rows.shape[1]}")
    blocks = rows.view(rows.shape[0], in_features // values, size)
    if tensor_type == "Q4_K":
        return _decode_q4_k(blocks)
    d = _fp16(blocks[..., 0:2])
    m = -8 * d if tensor_type == "Q4_0" else _fp16(blocks[..., 2:4])
    nibbles = _split(blocks[..., size - 16:])
    return nibbles.reshape(rows.shape[0], in_features), d, m


def _decode_q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_rows, num_supers = blocks.shape[:2]
    d, dmin = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    q = blocks[..., 4:16].int()
    # sub-blocks 0-3: the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7: bytes 8-11's halves
    # with the top 2 bits of bytes 0-3 and 4-7 above them
    scales = torch.cat((q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)), dim=-1)
    mins = torch.cat((q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)), dim=-1)
    sub_d = (d.unsqueeze(-1) * scales).reshape(num_rows, -1)
    sub_m = (-(dmin.unsqueeze(-1) * mins)).reshape(num_rows, -1)
    quads = blocks[..., 16:].reshape(num_rows, num_supers, 4, 32)  # per 64 values: two sub-blocks
    nibbles = torch.stack((quads & 0x0F, quads >> 4), dim=3)
    return nibbles.reshape(num_rows, -1), sub_d, sub_m


def _fp16(pairs: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes (little-endian fp16) -> [...] fp32"""
    return pairs.contiguous().view(torch.float16).squeeze(-1).float()


def _split(packed: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] nibbles: the low halves are values 0-15, the high halves 16-31"""
    return torch.cat((packed & 0x0F, packed >> 4), dim=-1)
