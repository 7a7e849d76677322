"""`python -m bench.gemm`: Formwork's bf16 GEMM against oneDNN's packed matmul, per layer shape.

For each of SmolLM2-135M's matmul shapes and each row count, the best of --repeats timings of
--calls calls (best-of-N: the machine is shared, and interference only ever adds time), in µs a
call and GFLOP/s, with the inner-loop peak (bench.roofline.measure_gemm_peak_gflops) to compare.
Set OMP_WAIT_POLICY=PASSIVE as the engine runs.
"""
from __future__ import annotations

import argparse

import torch

from bench.timing import best_seconds

# (name, N, K): the fused q/k/v, the attention output, the fused gate/up, the down projection, the head
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("head", 49152, 576)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,16,32,64,128,512")
    parser.add_argument("--shapes", default=",".join(name for name, _, _ in SHAPES))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from bench.roofline import measure_gemm_peak_gflops
    from engine.kernels.loader import load_cpu_kernels
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the CPU kernels did not build here")
    peak = measure_gemm_peak_gflops()
    print(f"GEMM {kernels.gemm_isa()}, {torch.get_num_threads()} threads, inner-loop peak {peak:.0f} GFLOP/s")
    print(f"{'shape':>8} {'rows':>5} {'formwork us':>12} {'GFLOP/s':>8} {'% peak':>7} {'oneDNN us':>10} {'GFLOP/s':>8}")
    wanted = set(args.shapes.split(","))
    for name, n, k in (s for s in SHAPES if s[0] in wanted):
        weight = torch.randn(n, k).bfloat16()
        ours = kernels.pack_weight(weight)
        theirs = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k).bfloat16()
            flops = 2 * rows * n * k
            fw = best_seconds(lambda: kernels.gemm(x, ours, n, None), args.calls, args.repeats)
            dnn = best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, theirs, None, "none", [], ""),
                               args.calls, args.repeats)
            print(f"{name:>8} {rows:>5} {fw * 1e6:12.1f} {flops / fw / 1e9:8.1f} {100 * flops / fw / 1e9 / peak:6.1f}% "
                  f"{dnn * 1e6:10.1f} {flops / dnn / 1e9:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
