"""bf16 linear layers with their weights pre-packed, on CPU.

Two layouts of each weight, chosen per call by the number of rows:
* up to 16 rows (decode batches): Formwork's AVX-512 BF16 kernel (engine/kernels/csrc/small_batch_gemm.cpp),
  which reads the weight at about 24 GB/s here against oneDNN's 13 — 30 layers' matmuls at one
  row 17.3 -> 8.9 ms, at 16 rows 31.1 -> 18.3 ms, cold cache; only where the CPU kernels were
  built with AVX-512 BF16;
* more rows: oneDNN with the weight packed once into its blocked layout. `F.linear` on a plain
  bf16 weight reorders it on every call; packed, the same products bit for bit, a decoder layer's
  four matmuls take 1.79 -> 1.36 ms at 64 rows.
Holding both costs a second copy of the matmul weights (257 MiB more for SmolLM2-135M in bf16).
fp32 stays on torch's default path: it is the exact-comparison mode, and oneDNN's fp32 sums
differ from MKL's in the last bits.

oneDNN's packing ops are torch's own (the ones its inductor uses for frozen CPU graphs) but
private, so every packed layer is checked against `F.linear` on both paths when it is made; any
failure leaves the plain layer in place.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.loader import load_cpu_kernels

logger = logging.getLogger(__name__)

SMALL_BATCH_ROWS = 16  # the small-batch kernel's limit (engine/kernels/csrc/small_batch_gemm.cpp)


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's blocked layout, and for decode batches in the
    small-batch kernel's (the plain copy is dropped)."""

    def __init__(self, packed_weight: torch.Tensor, bias: torch.Tensor | None, weight: torch.Tensor) -> None:
        super().__init__()
        self.packed_weight = packed_weight
        self.bias = bias
        self.out_features = weight.shape[0]
        # what a forward reads (the packed tensors are opaque): for roofline figures
        self.weight_bytes = weight.numel() * weight.element_size() + (0 if bias is None else bias.numel() * bias.element_size())
        self.kernels = load_cpu_kernels()
        self.small_batch_weight = None
        if (self.kernels is not None and self.kernels.small_batch_gemm_available()
                and weight.shape[0] % 16 == 0 and weight.shape[1] % 2 == 0):
            self.small_batch_weight = self.kernels.pack_small_batch_weight(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.small_batch_weight is not None and x.dim() == 2 and 1 <= x.shape[0] <= SMALL_BATCH_ROWS:
            return self.kernels.small_batch_gemm(x.contiguous(), self.small_batch_weight, self.out_features, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear | None:
    """A packed copy of the layer, or None where packing is unavailable or disagrees with F.linear."""
    if not can_pack(weight):
        return None
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    try:
        packed = PackedLinear(torch.ops.mkldnn._reorder_linear_weight(weight, 64), bias, weight)
        for rows in (3, 2 * SMALL_BATCH_ROWS):  # both paths
            probe = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(weight.dtype)
            with torch.no_grad():
                expected, got = F.linear(probe, weight, bias).float(), packed(probe).float()
            # one bf16 rounding step of the largest output is the most an order of summation can move it
            tolerance = 2 ** -7 * expected.abs().max().item() + 1e-6
            if got.shape != expected.shape or (got - expected).abs().max().item() > tolerance:
                raise RuntimeError(f"packed output disagrees with F.linear at {rows} rows")
        return packed
    except Exception as e:  # private op missing or changed: the plain layer works everywhere
        logger.warning("oneDNN weight packing unavailable, using plain bf16 matmuls: %s", e)
        return None


def pack_linears(module: nn.Module) -> int:
    """Replaces every nn.Linear under module with its packed form; returns how many (0: none could be)."""
    targets = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for count, (parent, name, child) in enumerate(targets):
        packed = pack_linear(child.weight, child.bias)
        if packed is None:  # the first failure says packing does not work here
            return count
        setattr(parent, name, packed)
    return len(targets)
