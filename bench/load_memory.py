"""Peak memory of loading a model, against its weight bytes.

    python -m bench.load_memory MODEL_DIR [--dtype bfloat16] [--pack | --int8 [--quantize-lm-head]]
    python -m bench.load_memory FILE.gguf  # a Q8_0 GGUF served as int8 from its blocks, against the file

Builds the model as the engine does (meta device, empty storage in the served dtype, safetensors
read tensor by tensor) in this process, then prints the process's peak resident memory before and
after loading, the weights' bytes, and their ratio. With --pack, the CPU fast paths' packing
(engine/kernels/cpu_linear.py) runs too, and its peak is printed separately; with --int8, the
quantization `--quantization int8` runs instead, and the resident weights are set against the int8
bytes (one byte per parameter). Run it in a fresh process: the peak is the process's own since it
started.
"""
from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--pack", action="store_true", help="also pack the matmul weights for the CPU fast paths")
    parser.add_argument("--int8", action="store_true", help="quantize as --quantization int8 does (instead of --pack)")
    parser.add_argument("--quantize-lm-head", action="store_true", help="with --int8: the head too")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from transformers import AutoConfig

    from engine.models import model_class

    if args.model_dir.endswith(".gguf"):
        return q8_0_gguf(Path(args.model_dir), getattr(torch, args.dtype))
    config = AutoConfig.from_pretrained(args.model_dir)
    base = peak_rss_bytes()
    with torch.device("meta"):
        model = model_class(config)(config, 2048)
    model = model.to(getattr(torch, args.dtype)).to_empty(device="cpu")
    model.load_weights(Path(args.model_dir))
    loaded = peak_rss_bytes()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gib = 1 << 30
    print(f"weights {weights / gib:.2f} GiB ({args.dtype}); process before loading {base / gib:.2f} GiB")
    print(f"peak RSS after loading {loaded / gib:.2f} GiB = {loaded / weights:.2f}x the weights "
          f"({(loaded - base) / weights:.2f}x counting only what loading added)")
    if args.pack:
        count = model.pack_cpu_weights()
        packed = peak_rss_bytes()
        print(f"peak RSS after packing {count} weights {packed / gib:.2f} GiB = {packed / weights:.2f}x the weights")
    if args.int8:
        parameters = sum(p.numel() for p in model.parameters())
        count = model.quantize_cpu_weights(args.quantize_lm_head, lenient=False)
        resident = model.resident_weight_bytes()
        print(f"int8: {count} weights quantized; resident weights {resident / gib:.3f} GiB = "
              f"{resident / parameters:.3f}x the int8 bytes ({parameters / gib:.3f} GiB, one a parameter); "
              f"peak RSS {peak_rss_bytes() / gib:.2f} GiB")
        served = served_bytes(model)
        print(f"resident weights = {resident / served:.3f}x the bytes of the formats served ({served / gib:.3f} GiB: "
              f"one a quantized value, the unquantized tensors (embedding or head, norms) at their dtype)")


def served_bytes(model) -> int:
    """The weights' bytes in the formats the model serves, without scales or padding: what any overhead is
    counted against."""
    from engine.kernels.cpu_linear import PackedLinear
    from engine.kernels.quantized_linear import QuantizedLinear

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, PackedLinear):
            total += module.weight_bytes  # its stored dtype, without padding
        elif isinstance(module, QuantizedLinear):
            bias_bytes = 0 if module.bias is None else module.bias.numel() * module.bias.element_size()
            total += module.out_features * module.in_features + bias_bytes
    return total


def q8_0_gguf(gguf: Path, dtype) -> None:
    """Peak memory of reading a Q8_0 GGUF's weights as int8 (engine/models/gguf_loader.py), against the file."""
    import torch
    from transformers import AutoConfig

    from engine.kernels.loader import load_cpu_kernels
    from engine.model_files import prepare_gguf
    from engine.models import model_class
    from engine.models.gguf_loader import load_quantized_gguf

    config = AutoConfig.from_pretrained(prepare_gguf(gguf, "int8"))
    load_cpu_kernels()  # the kernels' library is not the weights'
    base = peak_rss_bytes()
    with torch.device("meta"):
        model = model_class(config)(config, 2048)
    model = load_quantized_gguf(model, gguf, dtype)
    loaded, size, mib = peak_rss_bytes(), gguf.stat().st_size, 1 << 20
    print(f"{gguf.name}: {size / mib:.0f} MiB; process before loading {base / mib:.0f} MiB; resident weights "
          f"{model.resident_weight_bytes() / mib:.0f} MiB")
    print(f"peak RSS after loading {loaded / mib:.0f} MiB: loading added {(loaded - base) / mib:.0f} MiB = "
          f"{(loaded - base) / size:.2f}x the file")
    from engine.kernels.quantized_linear import QuantizedLinear
    parameters = sum(p.numel() for p in model.parameters()) + sum(
        m.out_features * m.in_features for m in model.modules() if isinstance(m, QuantizedLinear))
    print(f"resident weights = {model.resident_weight_bytes() / parameters:.3f}x the int8 bytes "
          f"({parameters / mib:.0f} MiB, one a parameter)")


if __name__ == "__main__":
    main()
