"""`python -m bench.q8_0_gguf OUT.gguf [--source IN.gguf]`: a Q8_0 copy of a GGUF model.

The default model ships as Q4_1 (its embedding as Q8_0); this writes the same model with every
quantized tensor re-quantized to Q8_0 by the `gguf` package (dequantized, then quantized in blocks
of 32 as llama.cpp does) and the metadata (config, tokenizer, chat template) copied as it is: a
Q8_0 file to serve with `--quantization int8` in tests and benchmarks.
"""
from __future__ import annotations

import argparse
from pathlib import Path


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


def main(argv: list[str] | None = None) -> None:
    from engine.model_files import default_gguf_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=None, help="default: the packaged SmolLM2 (Q4_1)")
    args = parser.parse_args(argv)
    print(write_q8_0_copy(args.source or default_gguf_path(), args.out))


if __name__ == "__main__":
    main()
