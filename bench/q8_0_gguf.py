"""`python -m bench.q8_0_gguf OUT.gguf [--source IN.gguf] [--random-shape qwen2.5-1.5b [--type Q4_0]]`: a Q8_0 GGUF model.

The default model ships as Q4_1 (its embedding as Q8_0); this writes the same model with every
quantized tensor re-quantized to Q8_0 by the `gguf` package (dequantized, then quantized in blocks
of 32 as llama.cpp does) and the metadata (config, tokenizer, chat template) copied as it is: a
Q8_0 file to serve with `--quantization int8` in tests and benchmarks.

With --random-shape, the file holds random weights of a bigger model's shape instead (normal,
std 0.02 as transformers initialises a Llama; norms 1), with the source's tokenizer and chat
template: one file that Formwork (`--model OUT.gguf --quantization int8`) and llama.cpp both
serve, so a comparison runs on the same weights. Throughput depends only on the shapes. --type
Q4_0, Q4_1 or Q4_K quantizes those random matrices to that type instead (the embedding stays Q8_0,
as in llama.cpp's 4-bit files of small models; Q4_K through bench/q4_k_blocks.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.q4_k_blocks import quantize_q4_k


def write_q8_0_copy(source: Path, target: Path) -> Path:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = bytes(reader.fields[gguf.Keys.General.ARCHITECTURE].parts[-1]).decode()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = gguf.LlamaFileType.MOSTLY_Q8_0
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0)
    for tensor in reader.tensors:
        if tensor.tensor_type in plain:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        values = gguf.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, gguf.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


# --type -> the file's general.file_type where it is not MOSTLY_<type> (a file of Q4_K layers is llama.cpp's Q4_K_S)
_FILE_TYPES = {"Q4_K": "MOSTLY_Q4_K_S"}
# llama.cpp `llama` keys of a shape; the vocabulary stays the source's (its tokenizer is copied)
RANDOM_SHAPES = {
    "qwen2.5-1.5b": {"block_count": 28, "embedding_length": 1536, "feed_forward_length": 8960,
                     "attention.head_count": 12, "attention.head_count_kv": 2, "rope.dimension_count": 128,
                     "rope.freq_base": 1000000.0},
}


def write_random_q8_0(source: Path, target: Path, shape: dict, seed: int = 0, tensor_type: str = "Q8_0") -> Path:
    """A llama-architecture GGUF of random weights of `shape` (the `llama` keys of RANDOM_SHAPES'
    entries), its layers' matrices of tensor_type (Q8_0, Q4_0, Q4_1 or Q4_K), its embedding Q8_0, and the
    source's tokenizer, template and vocabulary; the embedding is tied (no output.weight), as the
    source's."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = bytes(reader.fields[gguf.Keys.General.ARCHITECTURE].parts[-1]).decode()
    sizes = {f"{arch}.{key}": value for key, value in shape.items()}
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = sizes.get(field.name, field.contents())
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = getattr(gguf.LlamaFileType, _FILE_TYPES.get(tensor_type, f"MOSTLY_{tensor_type}"))
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    layer_type = getattr(gguf.GGMLQuantizationType, tensor_type)
    hidden, ffn = sizes[f"{arch}.embedding_length"], sizes[f"{arch}.feed_forward_length"]
    head_dim = hidden // sizes[f"{arch}.attention.head_count"]
    kv = head_dim * sizes[f"{arch}.attention.head_count_kv"]
    vocab = int(reader.fields[f"{arch}.vocab_size"].contents())
    rng = np.random.default_rng(seed)

    def matrix(name: str, rows: int, columns: int, kind=layer_type) -> None:  # rows: output features, llama.cpp's ne[1]
        values = rng.standard_normal((rows, columns), dtype=np.float32) * np.float32(0.02)
        blocks = quantize_q4_k(values) if kind == gguf.GGMLQuantizationType.Q4_K else gguf.quantize(values, kind)
        writer.add_tensor(name, blocks, raw_dtype=kind)

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(hidden, dtype=np.float32))

    matrix("token_embd.weight", vocab, hidden, gguf.GGMLQuantizationType.Q8_0)
    for i in range(sizes[f"{arch}.block_count"]):
        ones(f"blk.{i}.attn_norm.weight")
        ones(f"blk.{i}.ffn_norm.weight")
        for name, rows, columns in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                    ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden),
                                    ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            matrix(f"blk.{i}.{name}.weight", rows, columns)
    ones("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def main(argv: list[str] | None = None) -> None:
    from engine.model_files import default_gguf_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=None, help="default: the packaged SmolLM2 (Q4_1)")
    parser.add_argument("--random-shape", choices=sorted(RANDOM_SHAPES), default=None,
                        help="random weights of this shape, the source's tokenizer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--type", choices=("Q8_0", "Q4_0", "Q4_1", "Q4_K"), default="Q8_0",
                        help="with --random-shape: the layers' matrices' type")
    args = parser.parse_args(argv)
    source = args.source or default_gguf_path()
    if args.random_shape:
        print(write_random_q8_0(source, args.out, RANDOM_SHAPES[args.random_shape], args.seed, args.type))
    else:
        print(write_q8_0_copy(source, args.out))


if __name__ == "__main__":
    main()
