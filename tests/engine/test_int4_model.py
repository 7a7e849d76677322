"""GGUF files with 4-bit weights (Q4_0, Q4_1, Q4_K) under `--quantization int8`: multiplied in 4-bit
from the file's blocks, other types of a mixed file widened to int8, against the widened path."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from quantized_blocks import random_blocks
from test_int8_model import assert_the_fused_layers_give_the_op_by_op_bits, make_llm

from bench.quantization_agreement import agreement, greedy_answers, teacher_forced_choices
from engine.kernels.int4_linear import Int4Linear
from engine.kernels.int8_linear import Int8Linear

# a tiny Llama of whole Q4_K super-blocks (256 values), the packaged model's tokenizer
SHAPE = {"block_count": 2, "embedding_length": 256, "feed_forward_length": 512, "attention.head_count": 2,
         "attention.head_count_kv": 1, "rope.dimension_count": 128}


def random_gguf(path: Path, tensor_type: str) -> Path:
    from bench.q8_0_gguf import write_random_q8_0
    from engine.model_files import default_gguf_path
    return write_random_q8_0(default_gguf_path(), path, SHAPE, tensor_type=tensor_type)


def retyped(source: Path, target: Path, types: dict[str, str]) -> Path:
    """source with its layers' matrices named in types (attn_q, ffn_down, ...) replaced by random blocks
    of the type given, as llama.cpp's Q4_K_M mixes Q4_K and Q6_K."""
    import gguf
    import numpy as np
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, "llama")
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for seed, tensor in enumerate(reader.tensors):
        kind = types.get(tensor.name.split(".")[2]) if tensor.name.startswith("blk.") else None
        if kind is None or len(tensor.shape) != 2:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        in_features, num_rows = map(int, tensor.shape)
        rows = random_blocks(kind, num_rows, in_features, seed, scale=0.004 if kind == "Q4_K" else 0.0002)
        writer.add_tensor(tensor.name, rows.numpy(), raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def file_rows(path: Path, name: str, rows: torch.Tensor) -> torch.Tensor:
    import gguf
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type))[rows]


def test_4_bit_rows_are_decoded_a_few_heads_at_a_time(tmp_path, monkeypatch):
    """The loader reads and decodes a 4-bit tensor in chunks of rows into its layer; q and k rows, put
    back in Hugging Face's order head by head, land where a whole tensor's reordering puts them (Q4_1:
    its fp16 d and m are held exactly; Q4_K's rounded products are checked in test_int4_linear.py)."""
    import gguf
    from engine.models import gguf_loader
    path = random_gguf(tmp_path / "q4_1.gguf", "Q4_1")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    parts = [tensors[f"blk.0.attn_{name}.weight"] for name in ("q", "k", "v")]
    monkeypatch.setattr(gguf_loader, "_DECODE_ROWS", 100)  # 128-row heads: one head a chunk
    with open(path, "rb") as f:
        layer = gguf_loader._four_bit_linear(f, parts, (2, 1, None), 256, torch.bfloat16, None)
    expected = torch.cat([gguf_loader._unpermute(torch.from_numpy(gguf.dequantize(p.data, p.tensor_type)), heads)
                          if heads else torch.from_numpy(gguf.dequantize(p.data, p.tensor_type))
                          for p, heads in zip(parts, (2, 1, None))])
    torch.testing.assert_close(layer.dequantized_rows(torch.arange(512)), expected, rtol=2 ** -22, atol=2 ** -30)


def test_a_4_bit_gguf_is_served_in_4_bit(kernels, tmp_path, monkeypatch, caplog):
    """Q4_1, the packaged model's type (Q4_0 is the mixed file's below; every type's blocks are
    checked against the gguf package's decoding in test_int4_linear.py)."""
    tensor_type = "Q4_1"
    path = random_gguf(tmp_path / "random.gguf", tensor_type)
    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))  # the kernels are loaded already
    with caplog.at_level(logging.INFO):
        llm = make_llm(str(path), quantization="int8")
    try:
        assert f"matmul weights served from the file: {tensor_type} in 4-bit\n" in caplog.text
        assert f"in 4-bit: 14 {tensor_type} (attn_k, attn_output, attn_q, attn_v, ffn_down, ffn_gate, ffn_up)" in caplog.text
        model = llm.engine.runner.model
        for layer in model.layers:
            assert all(isinstance(p, Int4Linear) for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                           layer.down_proj))
        assert isinstance(model.packed_lm_head, Int8Linear)  # the embedding's Q8_0 blocks, tied
        rows = torch.tensor([0, 100, 255])
        torch.testing.assert_close(model.layers[1].down_proj.dequantized_rows(rows),
                                   file_rows(path, "blk.1.ffn_down.weight", rows), rtol=2 ** -23, atol=0)
        assert_the_fused_layers_give_the_op_by_op_bits(llm)
    finally:
        llm.shutdown()


def test_a_mixed_file_serves_its_4_bit_tensors_in_4_bit_and_widens_the_rest(kernels, tmp_path, monkeypatch, caplog):
    """Q4_K beside Q4_0 and Q6_K: q, k and v stack into one matmul, which a Q6_K v widens whole."""
    path = retyped(random_gguf(tmp_path / "q4_0.gguf", "Q4_0"), tmp_path / "mixed.gguf",
                   {"attn_q": "Q4_K", "attn_k": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "attn_v": "Q6_K",
                    "ffn_down": "Q6_K"})
    monkeypatch.setenv("FORMWORK_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO):
        llm = make_llm(str(path), quantization="int8")
    try:
        assert "Q4_0 in 4-bit, Q4_K in 4-bit, Q6_K widened to int8 per channel" in caplog.text
        assert "in 4-bit: 2 Q4_0 (attn_output), 4 Q4_K (ffn_gate, ffn_up)" in caplog.text
        assert "widened to int8 per channel: 4 Q4_K (attn_k, attn_q), 4 Q6_K (attn_v, ffn_down)" in caplog.text
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.gate_up_proj, Int4Linear) and isinstance(layer.o_proj, Int4Linear)
        assert isinstance(layer.qkv_proj, Int8Linear) and isinstance(layer.down_proj, Int8Linear)
        rows = torch.tensor([0, 200, 511])
        expected = file_rows(path, "blk.0.ffn_gate.weight", rows)
        # Q4_K's d * scale and dmin * min are held rounded to fp16: each off by at most 2^-11 of itself
        torch.testing.assert_close(layer.gate_up_proj.dequantized_rows(rows), expected, rtol=0,
                                   atol=2 ** -10 * expected.abs().max().item())
        assert_the_fused_layers_give_the_op_by_op_bits(llm)  # int8 and 4-bit matmuls in one layer
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_the_packaged_q4_1_model_in_4_bit_picks_the_widened_tokens(kernels, model_dir):
    """The default model (Q4_1) in 4-bit from its file, against the same model dequantized and
    quantized per channel to int8 (its folder under --quantization int8 before the 4-bit GEMM)."""
    from engine.model_files import gguf_weights_file, resolve_model
    assert gguf_weights_file(resolve_model(None, "int8")) is not None
    widened = make_llm(str(model_dir), quantization="int8", quantize_lm_head=True)
    prompts = [widened.encode_prompt([{"role": "user", "content": f"Tell me about {topic}."}])
               for topic in ("owls", "rivers", "glass", "bees", "the moon", "bread")]
    try:
        reference = greedy_answers(widened, prompts, 16)
    finally:
        widened.shutdown()
    llm = make_llm(None, quantization="int8")
    try:
        layer = llm.engine.runner.model.layers[0]
        assert isinstance(layer.down_proj, Int4Linear)
        assert agreement(reference, teacher_forced_choices(llm, prompts, reference)) >= 0.85
    finally:
        llm.shutdown()
