"""`python -m bench.gemm_int8`: the int8 and 4-bit GEMMs against the bf16 GEMM per row count.

For each matmul shape of a model (default: Qwen2.5-1.5B's, --shapes-of smollm2 for the default
model's) and row count: µs a call of the bf16 GEMM (kernels.gemm on a packed bf16 weight), of the
int8 GEMM (kernels.int8_gemm: x quantized per row and group of 64, then multiplied), of the 4-bit
GEMM (kernels.int4_gemm on a Q4_1-like weight, nib * d + m per 32 values, x per 32, as a GGUF Q4 file
is served) and of the activations' quantization alone (kernels.quantize_rows), best of --repeats
timings of --calls calls, the kernels alternated within each row count. The int8 weight is the 4-bit
one widened per channel, as a Q4 file was served before the 4-bit GEMM. A ratio above 1 means slower.
Set OMP_WAIT_POLICY=PASSIVE as the engine runs.
"""
from __future__ import annotations

import argparse
import os

import torch

from bench.timing import best_seconds

# (name, N, K) of the fused q/k/v, the attention output, the fused gate/up, the down projection
SHAPES = {"qwen2.5-1.5b": [("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960)],
          "smollm2": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes-of", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--rows", default="1,8,16,32,64,128")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from engine.kernels.loader import load_cpu_kernels
    from engine.kernels.int4_linear import Int4Linear
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the CPU kernels did not build here")
    print(f"bf16 GEMM {kernels.gemm_isa()}, int8 GEMM {kernels.int8_gemm_isa()}, 4-bit GEMM {kernels.int4_gemm_isa()} "
          f"(AMX-INT8 from 16 rows for int8, 32 for 4-bit, where the "
          f"CPU has it), {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    print(f"{'shape':>8} {'rows':>5} {'bf16 us':>9} {'int8 us':>9} {'int4 us':>9} {'int8/bf16':>9} {'int4/int8':>9} "
          f"{'quantize us':>11} {'int4 GOP/s':>10}")
    totals: dict[int, list[float]] = {}
    for name, n, k in SHAPES[args.shapes_of]:
        int4 = Int4Linear.from_nibbles(torch.randint(0, 16, (n, k), dtype=torch.uint8), torch.rand(n, k // 32) * 0.004,
                                       torch.rand(n, k // 32) * -0.03, torch.bfloat16, kernels)
        weight = int4.dequantized_rows(torch.arange(n)).bfloat16()
        packed_bf16 = kernels.pack_weight(weight)
        packed_int8, scales = kernels.pack_int8_weight(weight)
        del weight
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k).bfloat16()
            bf16 = best_seconds(lambda: kernels.gemm(x, packed_bf16, n, None), args.calls, args.repeats)
            int8 = best_seconds(lambda: kernels.int8_gemm(x, packed_int8, scales, n, None, False), args.calls,
                                args.repeats)
            four = best_seconds(lambda: int4(x), args.calls, args.repeats)
            quantize = best_seconds(lambda: kernels.quantize_rows(x, 64), args.calls, args.repeats)
            bf16 = min(bf16, best_seconds(lambda: kernels.gemm(x, packed_bf16, n, None), args.calls, args.repeats))
            int8 = min(int8, best_seconds(lambda: kernels.int8_gemm(x, packed_int8, scales, n, None, False),
                                          args.calls, args.repeats))
            four = min(four, best_seconds(lambda: int4(x), args.calls, args.repeats))
            total = totals.setdefault(rows, [0.0, 0.0, 0.0, 0.0])
            for i, seconds in enumerate((bf16, int8, four, quantize)):
                total[i] += seconds
            print(f"{name:>8} {rows:>5} {bf16 * 1e6:9.1f} {int8 * 1e6:9.1f} {four * 1e6:9.1f} {int8 / bf16:9.2f} "
                  f"{four / int8:9.2f} {quantize * 1e6:11.1f} {2 * rows * n * k / four / 1e9:10.1f}", flush=True)
    for rows, (bf16, int8, four, quantize) in totals.items():
        print(f"{'layer':>8} {rows:>5} {bf16 * 1e6:9.1f} {int8 * 1e6:9.1f} {four * 1e6:9.1f} {int8 / bf16:9.2f} "
              f"{four / int8:9.2f} {quantize * 1e6:11.1f}")
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
