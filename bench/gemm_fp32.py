"""`python -m bench.gemm_fp32`: the kernels' fp32 GEMM against torch's fp32 matmul, per shape and row count.

The path of CPUs without bf16 dot products (gemm_fp32.cpp): fp32 activations, the weight held as fp32
or as bf16 widened in registers. For each shape and row count, the best of --repeats timings of
--calls calls (best-of-N: the machine may be shared, and interference only ever adds time), in
GFLOP/s, torch's F.linear on the same operands beside it. --copies N cycles each call through N copies
of the weight, so that it comes from memory as in a forward pass (1: the weight stays in L2).
FORMWORK_CPU_ISA=avx2 measures the AVX2 build on any x86 CPU (torch held to AVX2 too: set before torch
is imported, as here).
"""
from __future__ import annotations

import argparse

from bench.timing import best_seconds

# (name, N, K): SmolLM2-135M's square projection, its intermediate (gate or up) projection, the down projection
SHAPES = [("576x576", 576, 576), ("576x1536", 1536, 576), ("1536x576", 576, 1536)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,64,256,512")
    parser.add_argument("--shapes", default="576x576,576x1536", help=f"of {', '.join(s[0] for s in SHAPES)}")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--copies", type=int, default=1, help="copies of each weight, called in turn (cold weights)")
    parser.add_argument("--threads", type=int, default=0, help="torch's and the kernels' threads (0: torch's default)")
    args = parser.parse_args()
    from engine.config import cpu_isa, limit_torch_to_cpu_isa
    limit_torch_to_cpu_isa()
    import torch
    import torch.nn.functional as F

    if args.threads:
        torch.set_num_threads(args.threads)  # before the kernels' pool starts: it sizes itself from this
    from engine.kernels.loader import load_cpu_kernels
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the CPU kernels did not build here")
    print(f"fp32 GEMM {kernels.gemm_fp32_isa()} (FORMWORK_CPU_ISA={cpu_isa()}), {torch.get_num_threads()} threads; "
          f"GFLOP/s, best of {args.repeats} x {args.calls} calls")
    print(f"{'K x N':>9} {'rows':>5} {'fp32-held':>10} {'bf16-held':>10} {'torch':>8} {'fp32/torch':>11}")
    wanted = set(args.shapes.split(","))
    for name, n, k in (s for s in SHAPES if s[0] in wanted):
        weights = [torch.randn(n, k).bfloat16().float() for _ in range(args.copies)]
        held_fp32 = [kernels.pack_weight(w) for w in weights]
        held_bf16 = [kernels.pack_weight(w.bfloat16()) for w in weights]

        def each(call):  # a round over every copy, timed as one call (its flops counted `copies` times)
            return lambda: [call(i) for i in range(args.copies)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            flops = 2 * rows * n * k * args.copies
            fp32 = flops / best_seconds(each(lambda i: kernels.gemm(x, held_fp32[i], n, None)), args.calls,
                                        args.repeats) / 1e9
            bf16 = flops / best_seconds(each(lambda i: kernels.gemm(x, held_bf16[i], n, None)), args.calls,
                                        args.repeats) / 1e9
            ref = flops / best_seconds(each(lambda i: F.linear(x, weights[i])), args.calls, args.repeats) / 1e9
            print(f"{name:>9} {rows:>5} {fp32:10.1f} {bf16:10.1f} {ref:8.1f} {fp32 / ref:10.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
