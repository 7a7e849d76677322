"""llama.cpp's Q4_K blocks from float values, for benchmark files (the `gguf` package dequantizes Q4_K
but does not quantize to it).

Per 256 values: fp16 d and dmin, 12 bytes of 6-bit scales and mins for the 8 sub-blocks of 32, then
128 bytes of nibbles; w = nib (d sc) - dmin mn (engine/models/gguf_blocks.py reads them). Each
sub-block's scale and min come from its own range (min clamped to 0 from above, as llama.cpp's), d and
dmin from the largest of the 8; llama.cpp's search for better scales is left out: the blocks are
valid and near the values, which is what a throughput benchmark needs.
"""
from __future__ import annotations

import numpy as np

SUPER = 256  # values per block
SUB = 32  # values per sub-block: one scale and min


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """float [rows, K] (K a multiple of 256) -> uint8 [rows, K / 256 * 144]."""
    rows, k = values.shape
    x = values.astype(np.float32).reshape(rows, k // SUPER, SUPER // SUB, SUB)
    low = np.minimum(x.min(axis=-1), 0.0)
    scale = (x.max(axis=-1) - low) / 15.0  # [rows, supers, 8]
    d = (scale.max(axis=-1) / 63.0).astype(np.float16)
    dmin = (-low.min(axis=-1) / 63.0).astype(np.float16)
    sc = _six_bits(scale, d)
    mn = _six_bits(-low, dmin)
    step = d.astype(np.float32)[..., None] * sc  # each sub-block's d sc and dmin mn, as the reader forms them
    offset = dmin.astype(np.float32)[..., None] * mn
    with np.errstate(divide="ignore", invalid="ignore"):
        nib = np.where(step[..., None] > 0, np.rint((x + offset[..., None]) / step[..., None]), 0)
    nib = np.clip(nib, 0, 15).astype(np.uint8)  # [rows, supers, 8, 32]
    packed = np.empty((rows, k // SUPER, 144), dtype=np.uint8)
    packed[..., 0:2] = d[..., None].view(np.uint8)
    packed[..., 2:4] = dmin[..., None].view(np.uint8)
    # sub-blocks 0-3: 6 bits in bytes 0-3 (scales) and 4-7 (mins); 4-7: their low 4 bits in bytes 8-11,
    # their top 2 bits in the top of bytes 0-7
    packed[..., 4:8] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 8:12] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    packed[..., 12:16] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    # per 64 values, 32 bytes: the first sub-block in the low halves, the second in the high ones
    packed[..., 16:] = (nib[:, :, 0::2] | (nib[:, :, 1::2] << 4)).reshape(rows, k // SUPER, 128)
    return packed.reshape(rows, -1)


def _six_bits(value: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """value / unit rounded into 0..63 (0 where the unit is 0)"""
    unit = unit.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(unit > 0, np.rint(value / unit), 0)
    return np.clip(q, 0, 63).astype(np.uint8)
