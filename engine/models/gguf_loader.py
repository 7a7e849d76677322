"""A GGUF file's quantized weights served straight from the file (`--quantization int8`).

llama.cpp's Q8_0 keeps each 32 values of a row as int8 with one fp16 scale, which is the int8
GEMM's own arithmetic with a scale per 32 values (engine/kernels/csrc/int8_gemm.cpp): the blocks
are re-laid into the GEMM's layout as they are, never widened to float on the way, and the scales
stay per block (a per-channel scale could not hold them exactly). Q4_0, Q4_1 and Q4_K blocks are
decoded to nibbles with a d and m per 32 values (engine/models/gguf_blocks.py) and multiplied in
4-bit (Int4Linear), d and m held as fp16: the file's own for Q4_0 and Q4_1 (no rounding on the way
either), Q4_K's d * sub-scale products rounded to fp16. Tensors of the other types a file may mix in
(Q5_0, Q6_K, ... in llama.cpp's Q4_K_M) are dequantized and quantized per channel to int8, as a 4-bit
file was served before; the start-up log names which tensors went which way. Each tensor is read
with plain file reads into one temporary buffer and packed (a 4-bit one a few hundred rows at a time,
decoded straight into its layer's layout): peak memory is the packed weights plus the largest tensor
(4-bit: one chunk), and the file's pages never count in the process's resident memory (as a mapped
file's do).

Only llama.cpp's `llama` architecture (Llama, Mistral, SmolLM and the like) is read here; the
config and tokenizer come from transformers, prepared once (engine/model_files.py). Tensor types:
Q8_0 and 4-bit matmul weights as they are; F32/F16/BF16 and the other quantized types quantized
per channel; F32/F16/BF16 norms in the served dtype. The embedding shares its copy with a tied
head, and an untied head is read as the file holds it: the file's own precision.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from engine.kernels.cpu_linear import PackedEmbedding
from engine.kernels.int4_linear import Int4Linear
from engine.kernels.int8_linear import Int8Linear, int8_unsupported_reason
from engine.kernels.loader import load_cpu_kernels
from engine.model_files import FOUR_BIT_TYPES, GGUF_READABLE_TYPES, gguf_index
from engine.models.gguf_blocks import decode_four_bit

logger = logging.getLogger(__name__)

# GGUF tensor type name -> torch dtype of the values as stored (quantized types: rows of blocks, as bytes)
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
SUPPORTED_TYPES = GGUF_READABLE_TYPES
# how a matmul's tensors are served, for the start-up log
FOUR_BIT, Q8_0_BLOCKS, WIDENED = "in 4-bit", "as int8 from their Q8_0 blocks", "widened to int8 per channel"

_DECODE_ROWS = 256  # rows of a 4-bit tensor read and decoded at a time (whole heads of q and k)
# per layer: checkpoint name in the file -> our parameter
_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def load_quantized_gguf(model, path: Path, dtype: torch.dtype):
    """Fill `model` (a DecoderForCausalLM built on the meta device) from the GGUF file at path: its
    matmuls become Int4Linear (Q4_0, Q4_1, Q4_K) or Int8Linear layers (each layer then runs as the
    kernels' one call), the rest gets storage in dtype and the file's values; logs which tensors went
    which way. ValueError naming the tensor for an architecture, type or name this path does not read."""
    kernels = load_cpu_kernels()
    if kernels is None:
        raise ValueError("--quantization int8 needs Formwork's CPU kernels, which could not be built here")
    arch, index = gguf_index(path)
    if arch != "llama":
        raise ValueError(f"{path.name}: the int8 GGUF path reads llama.cpp's llama architecture, not {arch!r}")
    tensors = {t.name: t for t in index}
    config = model.config
    unread = set(tensors)
    ways: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))  # way -> type -> tensors
    with open(path, "rb") as f:
        def linear(*names: str, heads: tuple[int | None, ...] = ()) -> Int4Linear | Int8Linear:
            unread.difference_update(names)
            parts = [tensors[n] for n in names]
            way, layer = _linear(f, parts, heads, dtype, kernels)
            for p in parts:
                ways[way][p.tensor_type.name].append(p.name)
            return layer

        # the embedding (and an untied head) first: their temporaries come and go before the layers are held
        embedding = linear("token_embd.weight")
        head = linear("output.weight") if "output.weight" in tensors else embedding
        for i, layer in enumerate(model.layers):
            blk = f"blk.{i}"
            # llama.cpp interleaves the rotary halves of q and k rows: undone row by row, as transformers does
            layer.qkv_proj = linear(f"{blk}.attn_q.weight", f"{blk}.attn_k.weight", f"{blk}.attn_v.weight",
                                    heads=(config.num_attention_heads, config.num_key_value_heads, None))
            layer.o_proj = linear(f"{blk}.attn_output.weight")
            layer.gate_up_proj = linear(f"{blk}.ffn_gate.weight", f"{blk}.ffn_up.weight")
            layer.down_proj = linear(f"{blk}.ffn_down.weight")
        model.embed_tokens = PackedEmbedding(embedding)
        model.packed_lm_head, model.lm_head = head, None
        model.use_fused_kernels()
        model.to(dtype).to_empty(device="cpu")
        params = dict(model.named_parameters())
        norms = {f"blk.{i}.{name}.weight": f"layers.{i}.{ours}.weight"
                 for i in range(len(model.layers)) for name, ours in _NORMS.items()}
        norms["output_norm.weight"] = "norm.weight"
        for name, ours in norms.items():
            if name not in tensors:
                raise ValueError(f"{path.name} has no tensor {name}")
            unread.discard(name)
            params.pop(ours).data.copy_(_read_float(f, tensors[name]).view(-1))
    leftover = sorted(unread - {"rope_freqs.weight"})  # llama3's rope table: our rope comes from the config
    if leftover or params:
        raise ValueError(f"{path.name}: the int8 GGUF path reads Llama's tensors only; "
                         f"unread: {leftover[:3]}, unfilled: {sorted(params)[:3]}")
    logger.info("%s: matmul weights %s", path.name, "; ".join(
        f"{way}: " + ", ".join(f"{len(names)} {kind} ({_names(names)})" for kind, names in sorted(by_type.items()))
        for way, by_type in ways.items()))
    return model


def _names(names: list[str]) -> str:
    """blk.N.attn_q.weight, ... -> attn_q, ... (the layers' share), or the tensor names outside layers"""
    short = sorted({n.split(".")[2] if n.startswith("blk.") else n.removesuffix(".weight") for n in names})
    return ", ".join(short)


def _linear(f, parts: list, heads: tuple[int | None, ...], dtype: torch.dtype,
            kernels) -> tuple[str, Int4Linear | Int8Linear]:
    """(how it is served, the layer) from GGUF tensors stacked by rows (q, k, v or gate, up): in
    4-bit when every part is a 4-bit type, from the Q8_0 blocks when every part is Q8_0, else the
    parts dequantized and quantized per channel to int8."""
    types = {p.tensor_type.name for p in parts}
    for p in parts:
        if p.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"GGUF tensor {p.name} is {p.tensor_type.name}, which the int8 path does not "
                             f"read; supported: {', '.join(SUPPORTED_TYPES)}")
    in_features = int(parts[0].shape[0])  # GGUF lists a matrix's dimensions innermost first
    if any(len(p.shape) != 2 or int(p.shape[0]) != in_features for p in parts):
        raise ValueError(f"GGUF tensors {[p.name for p in parts]} cannot be stacked: shapes "
                         f"{[list(map(int, p.shape)) for p in parts]}")
    heads = heads or (None,) * len(parts)
    if types <= set(FOUR_BIT_TYPES):
        return FOUR_BIT, _four_bit_linear(f, parts, heads, in_features, dtype, kernels)
    if types == {"Q8_0"}:
        stacked = _stacked([_read_rows(f, p) for p in parts], heads)
        return Q8_0_BLOCKS, Int8Linear.from_q8_0(stacked, stacked.shape[0], in_features, dtype, kernels)
    stacked = _stacked([_read_weight(f, p) for p in parts], heads)
    reason = int8_unsupported_reason(stacked)
    if reason is not None:
        raise ValueError(f"--quantization int8: GGUF tensor {parts[0].name} cannot be quantized: {reason}")
    return WIDENED, Int8Linear.from_weight(stacked, None, kernels)


def _four_bit_linear(f, parts: list, heads: tuple[int | None, ...], in_features: int, dtype: torch.dtype,
                     kernels) -> Int4Linear:
    """The parts' rows one under another in 4-bit, read and decoded a chunk of rows at a time into the
    layer's own layout: loading holds the layer and one chunk, never a whole tensor decoded."""
    layer = Int4Linear.zeros(sum(int(p.shape[1]) for p in parts), in_features, dtype, kernels)
    start = 0
    for part, num_heads in zip(parts, heads):
        num_rows = int(part.shape[1])
        head_rows = num_rows // num_heads if num_heads else 1
        chunk = max(1, _DECODE_ROWS // head_rows) * head_rows  # whole heads: q and k rows reorder within one
        for r0 in range(0, num_rows, chunk):
            rows = _read_rows(f, part, r0, min(num_rows, r0 + chunk))
            if num_heads:
                rows = _unpermute(rows, rows.shape[0] // head_rows)
            layer.set_rows(start + r0, *decode_four_bit(rows, part.tensor_type.name, in_features))
        start += num_rows
    return layer


def _stacked(parts: list[torch.Tensor], heads: tuple[int | None, ...]) -> torch.Tensor:
    """The parts' rows one under another, those of q and k (heads given) in Hugging Face's order."""
    rows = [_unpermute(rows, n) if n else rows for rows, n in zip(parts, heads)]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def _read_weight(f, tensor) -> torch.Tensor:
    """The tensor's values as a float matrix [N, K]: a float type as stored, a quantized one dequantized
    to float32 (by the gguf package, as the file's preparation dequantizes it)."""
    rows = _read_rows(f, tensor)
    if tensor.tensor_type.name in _FLOAT_TYPES:
        return rows
    from gguf import dequantize
    return torch.from_numpy(dequantize(rows.numpy(), tensor.tensor_type))


def _read_rows(f, tensor, first: int = 0, end: int | None = None) -> torch.Tensor:
    """The tensor's rows [first, end) as stored (all by default): uint8 [rows, bytes per row] for a
    quantized type, else [rows, K] of its float dtype."""
    num_rows, in_features = int(tensor.shape[1]), int(tensor.shape[0])
    end = num_rows if end is None else end
    if tensor.tensor_type.name in _FLOAT_TYPES:
        out = torch.empty(end - first, in_features, dtype=_FLOAT_TYPES[tensor.tensor_type.name])
        _check_size(tensor, num_rows * in_features * out.element_size())
    else:  # whole blocks per row (the kernels' packers and the decoders check their sizes)
        out = torch.empty(end - first, int(tensor.n_bytes) // num_rows, dtype=torch.uint8)
    _read_at(f, tensor, first * out.shape[1] * out.element_size(), out)
    return out


def _read_float(f, tensor) -> torch.Tensor:
    if tensor.tensor_type.name not in _FLOAT_TYPES:
        raise ValueError(f"GGUF tensor {tensor.name} is {tensor.tensor_type.name}; the int8 path reads "
                         f"norms as {', '.join(_FLOAT_TYPES)}")
    out = torch.empty(int(np.prod([int(d) for d in tensor.shape])), dtype=_FLOAT_TYPES[tensor.tensor_type.name])
    _check_size(tensor, out.numel() * out.element_size())
    _read_at(f, tensor, 0, out)
    return out


def _check_size(tensor, expected: int) -> None:
    if int(tensor.n_bytes) != expected:
        raise ValueError(f"GGUF tensor {tensor.name} holds {int(tensor.n_bytes)} bytes, its shape needs {expected}")


def _read_at(f, tensor, offset: int, out: torch.Tensor) -> None:
    """out's bytes from the tensor's data, offset bytes in."""
    expected = out.numel() * out.element_size()
    f.seek(int(tensor.data_offset) + offset)
    if f.readinto(out.view(-1).view(torch.uint8).numpy()) != expected:
        raise ValueError(f"GGUF tensor {tensor.name} is truncated")


def _unpermute(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order back to Hugging Face's: per head, rows (0, 2, 4, ..., 1, 3, ...)."""
    half = rows.shape[0] // num_heads // 2
    return rows.view(num_heads, half, 2, rows.shape[1]).transpose(1, 2).reshape(rows.shape)
