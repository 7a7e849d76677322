"""The decode roofline: how far a Formwork decode step is from reading the weights once.

At batch 1 a decode step must read every weight once (SmolLM2's embedding matrix doubles as the
output projection, so all of it), so weight bytes ÷ memory bandwidth is a floor for the step.
Bandwidth is measured here with a large copy (read + write counted).
"""
from __future__ import annotations

import math
import time
from pathlib import Path


def measure_bandwidth_gbs(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Best of `repeats` copies of a num_bytes float32 tensor (torch's threads), read + write."""
    import torch
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best / 1e9


def measure_gemm_peak_gflops(repeats: int = 5, tiles: int = 20000) -> float | None:
    """The bf16 GEMM's inner loop alone, that of its batch kernel (AMX tiles where the CPU has them,
    else the AVX-512 BF16 register tile walking 64 rows down an L2-resident weight panel; on every
    thread of the kernels' pool): the best of `repeats` runs of `tiles` tiles per thread. None
    without the CPU kernels."""
    from engine.kernels.loader import load_cpu_kernels
    kernels = load_cpu_kernels()
    if kernels is None:
        return None
    return max(kernels.gemm_inner_loop_gflops(tiles) for _ in range(repeats))


def measure_torch_matmul_gflops(dtype: str = "float32", repeats: int = 5, calls: int = 20) -> float:
    """torch's own matmul at a prompt chunk's shape (512 rows by SmolLM2's 576 x 3072 gate/up), the
    best of `repeats` runs of `calls` products: the peak of a model torch multiplies."""
    import torch
    x = torch.randn(512, 576).to(getattr(torch, dtype))
    w = torch.randn(3072, 576).to(x.dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            torch.nn.functional.linear(x, w)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2 * 512 * 576 * 3072 / best / 1e9


def matmul_peak(model, repeats: int = 5, tiles: int = 20000) -> tuple[float, str]:
    """The peak GFLOP/s of the matmul path `model` runs, and its name: the kernels' inner loop for
    the layers they multiply (the bf16 GEMM's, or the fp32 GEMM's with the weights as held),
    torch's matmul for layers left plain. "% of the peak" then compares a run with what its own
    kernel does at best on this CPU."""
    import torch

    from engine.kernels.cpu_linear import PackedLinear
    layer = model.layers[0].qkv_proj
    if not isinstance(layer, PackedLinear) or layer.kernels is None:
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        return measure_torch_matmul_gflops(dtype, repeats), f"torch {dtype} matmul"
    kernels = layer.kernels
    if layer.dtype == torch.float32:
        bf16_weights = layer.stored_dtype == torch.bfloat16
        peak = max(kernels.gemm_fp32_inner_loop_gflops(tiles, bf16_weights) for _ in range(repeats))
        held = "bf16" if bf16_weights else "fp32"
        return peak, f"fp32 GEMM inner loop ({kernels.gemm_fp32_isa()}, {held} weights)"
    return max(kernels.gemm_inner_loop_gflops(tiles) for _ in range(repeats)), \
        f"bf16 GEMM inner loop ({kernels.gemm_isa()})"


def weight_bytes(model_dir: Path, dtype: str = "float32") -> int:
    """Bytes of the weights as served: every stored tensor once (tied embeddings are stored once),
    in the engine's dtype (it casts the fp32 files when loading)."""
    import torch
    from safetensors import safe_open
    files = list(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    count = 0
    for file in files:
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                count += math.prod(shape)
    return count * torch.finfo(getattr(torch, dtype)).bits // 8


def roofline(model_dir: Path, unconstrained_runs: list[dict], dtype: str = "float32") -> dict:
    """The floor, the batch-1 step time ÷ floor, and the curve over batch size.

    The step time at batch B is the client-side inter-token latency p50 of the unconstrained
    json-extraction run at concurrency B (one token per request per step)."""
    bandwidth = measure_bandwidth_gbs()
    num_bytes = weight_bytes(model_dir, dtype)
    floor_s = num_bytes / (bandwidth * 1e9)
    curve = [{"batch": r["concurrency"], "step_ms": 1e3 * r["itl_s_p50"], "tokens_per_s": r["output_token_throughput"],
              "step_over_floor": r["itl_s_p50"] / floor_s}
             for r in sorted(unconstrained_runs, key=lambda r: r["concurrency"])
             if r.get("itl_s_p50") and not r.get("num_errors")]  # a run cut by deadlines says nothing
    batch1 = next((c for c in curve if c["batch"] == 1), None)
    return {"bandwidth_gbs": bandwidth, "weight_mib": num_bytes / 2**20, "floor_ms": 1e3 * floor_s,
            "batch1_step_ms": batch1["step_ms"] if batch1 else None,
            "batch1_step_over_floor": batch1["step_over_floor"] if batch1 else None, "curve": curve}
