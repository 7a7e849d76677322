"""bf16 linear layers with their weights packed once, on CPU.

One packed copy of each weight serves every batch size, decode rows and prompt chunks alike; the
plain weight is dropped once it is packed:
* with Formwork's CPU kernels: their GEMM (engine/kernels/csrc/gemm.cpp), which reads the weight as
  16-column blocks of K pairs: AMX tiles where the CPU has them, else AVX-512 BF16 dot products,
  else a portable fp32 kernel, the same one for every row count, so that a row's output does not
  depend on the other rows of the batch. `rows(ids)` reads plain rows back out of that copy, so a
  tied embedding can share its head's copy instead of keeping its own;
* without them (no compiler): oneDNN with the weight packed once into its blocked layout.
  `F.linear` on a plain bf16 weight reorders it on every call; packed, the same products bit for bit.
fp32 stays on torch's default path: it is the exact-comparison mode, and other sums differ from
MKL's in the last bits.

oneDNN's packing ops are torch's own (the ones its inductor uses for frozen CPU graphs) but
private, and the kernels are built here, so every packed layer is checked against `F.linear` when
it is made; any failure leaves the plain layer in place.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.loader import load_cpu_kernels

logger = logging.getLogger(__name__)

BLOCK_COLUMNS = 16  # output columns per block of the kernels' layout (engine/kernels/csrc/gemm.cpp)


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held once, in the layout of the kernel that multiplies by it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.kernels = kernels
        if kernels is not None:
            self.packed_weight = kernels.pack_weight(weight)
        else:
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
        # what a forward reads (the packed tensors are opaque or padded): for roofline figures
        self.weight_bytes = weight.numel() * weight.element_size() + _bytes(bias)

    @property
    def resident_bytes(self) -> int:
        """Bytes this layer holds in memory (the packed copy with its padding, the bias)."""
        try:
            held = self.packed_weight.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # an opaque oneDNN tensor
            held = self.weight_bytes - _bytes(self.bias)
        return held + _bytes(self.bias)

    @property
    def shares_rows(self) -> bool:
        """Whether rows() can read the weight back (the kernels' layout; not oneDNN's)."""
        return self.kernels is not None

    def forward(self, x: torch.Tensor, fp32_out: bool = False) -> torch.Tensor:
        """x @ W.T (+ bias) in x's dtype; fp32_out: in float32, from the kernels' fp32 sums unrounded
        (oneDNN's result is only widened)."""
        if self.kernels is None:
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
            return y.float() if fp32_out else y
        if x.dim() == 2 and x.stride(1) == 1:  # the decoder's case, every matmul of a step: nothing to reshape
            return self.kernels.gemm(x, self.packed_weight, self.out_features, self.bias, fp32_out)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = self.kernels.gemm(flat, self.packed_weight, self.out_features, self.bias, fp32_out)
        return y.view(*x.shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] read from the packed copy: [*ids.shape, in_features] (an embedding lookup, the
        head rows of a few candidates)."""
        if not self.shares_rows:
            raise RuntimeError("rows() needs the kernels' layout; this layer is packed for oneDNN")
        ids = ids.long()
        # [blocks, K pairs (padded), 16, 2]: row i is column i % 16 of block i // 16, across every pair
        picked = self.packed_weight[ids // BLOCK_COLUMNS, :, ids % BLOCK_COLUMNS, :]
        rows = picked.reshape(*ids.shape, picked.shape[-2] * picked.shape[-1])  # -1 is ambiguous for no ids
        return rows if rows.shape[-1] == self.in_features else rows[..., :self.in_features].contiguous()


class PackedEmbedding(nn.Module):
    """An embedding that looks its rows up in a tied head's packed copy (no copy of its own)."""

    def __init__(self, head: PackedLinear) -> None:
        super().__init__()
        self.head = head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def can_pack(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and (
        load_cpu_kernels() is not None
        or (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")))


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear | None:
    """A packed copy of the layer, or None where packing is unavailable or disagrees with F.linear."""
    if not can_pack(weight):
        return None
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    try:
        packed = PackedLinear(weight, bias, load_cpu_kernels())
        for rows in (3, 40):  # a decode-sized and a chunk-sized product: every tile shape of the kernel
            probe = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(weight.dtype)
            with torch.no_grad():
                expected, got = F.linear(probe, weight, bias).float(), packed(probe).float()
            # one bf16 rounding step of the largest output is the most an order of summation can move it
            tolerance = 2 ** -7 * expected.abs().max().item() + 1e-6
            if got.shape != expected.shape or (got - expected).abs().max().item() > tolerance:
                raise RuntimeError(f"packed output disagrees with F.linear at {rows} rows")
        return packed
    except Exception as e:  # private op missing or changed, a kernel that disagrees: the plain layer works everywhere
        logger.warning("weight packing unavailable, using plain bf16 matmuls: %s", e)
        return None


def pack_linears(module: nn.Module) -> int:
    """Replaces every nn.Linear under module with its packed form; returns how many (0: none could be)."""
    # names, not the layers: a list holding every plain layer would keep all of them alive beside
    # their packed copies until the last is packed (twice the weights at the peak)
    targets = [(parent, name) for parent in module.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for count, (parent, name) in enumerate(targets):
        plain = getattr(parent, name)
        packed = pack_linear(plain.weight, plain.bias)
        if packed is None:  # the first failure says packing does not work here
            return count
        del plain
        setattr(parent, name, packed)
    return len(targets)
