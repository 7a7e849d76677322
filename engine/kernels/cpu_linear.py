"""Linear layers with their weights packed once, on CPU.

One packed copy of each weight serves every batch size, decode rows and prompt chunks alike; the
plain weight is dropped once it is packed:
* with Formwork's CPU kernels: their GEMM (engine/kernels/csrc/gemm.cpp), which reads the weight as
  16-column blocks of K pairs: AMX tiles where the CPU has them, else AVX-512 BF16 dot products,
  else a portable fp32 kernel, the same one for every row count, so that a row's output does not
  depend on the other rows of the batch. `rows(ids)` reads plain rows back out of that copy, so a
  tied embedding can share its head's copy instead of keeping its own;
* float32 models on the kernels' fp32 GEMM (gemm_fp32.cpp: AVX2 + FMA, batch-invariant too), the
  weight held as bf16 wherever every value of it is a bf16 value (a checkpoint stored in bf16):
  the same products bit for bit from half the bytes, widened in registers;
* bf16 without the kernels (no compiler): oneDNN with the weight packed once into its blocked layout.
  `F.linear` on a plain bf16 weight reorders it on every call; packed, the same products bit for bit.
  float32 without the kernels stays on torch's default path.

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

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels,
                 stored_dtype: torch.dtype | None = None) -> None:
        """stored_dtype: bfloat16 holds a float32 layer's weight rounded to bf16 (the kernels only);
        None: the weight's dtype, or bf16 where that loses nothing."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype  # of x, the output and rows(); the packed copy may be narrower (stored_dtype)
        self.bias = bias
        self.kernels = kernels
        if stored_dtype is not None and kernels is not None:
            stored = weight.to(stored_dtype)
        else:
            stored = _narrowest_exact(weight) if kernels is not None else weight
        self.stored_dtype = stored.dtype
        if kernels is not None:
            self.packed_weight = kernels.pack_weight(stored)
        else:
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
        # what a forward reads (the packed tensors are opaque or padded): for roofline figures
        self.weight_bytes = stored.numel() * stored.element_size() + _bytes(bias)

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

    def kernel_projection(self):
        """This layer as the kernels' fused decoder layer takes a matmul (their Projection), or None
        for a oneDNN-packed weight."""
        return None if self.kernels is None else self.kernels.Projection("float", self.packed_weight, None, self.bias)

    def forward(self, x: torch.Tensor, fp32_out: bool = False) -> torch.Tensor:
        """x @ W.T (+ bias) in x's dtype; fp32_out: in float32, from the kernels' fp32 sums unrounded
        (oneDNN's result is only widened; float32 x: what it is anyway)."""
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
        if self.packed_weight.dim() == 3:  # float32: [blocks, K, 16], row i is column i % 16 of block i // 16
            return self.packed_weight[ids // BLOCK_COLUMNS, :, ids % BLOCK_COLUMNS]
        # [blocks, K pairs (padded), 16, 2]: row i is column i % 16 of block i // 16, across every pair
        picked = self.packed_weight[ids // BLOCK_COLUMNS, :, ids % BLOCK_COLUMNS, :]
        rows = picked.reshape(*ids.shape, picked.shape[-2] * picked.shape[-1])  # -1 is ambiguous for no ids
        rows = rows if rows.shape[-1] == self.in_features else rows[..., :self.in_features]
        return rows.to(self.dtype) if self.dtype != self.stored_dtype else rows.contiguous()


class PackedEmbedding(nn.Module):
    """An embedding that looks its rows up in a tied head's packed copy (no copy of its own)."""

    def __init__(self, head: PackedLinear) -> None:
        super().__init__()
        self.head = head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _narrowest_exact(weight: torch.Tensor) -> torch.Tensor:
    """weight as bf16 where that loses nothing (a float32 weight whose every value is a bf16 value), else itself."""
    if weight.dtype != torch.float32:
        return weight
    narrow = weight.bfloat16()
    return narrow if torch.equal(narrow.float(), weight) else weight


def can_pack(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu":
        return False
    if weight.dtype == torch.float32:
        return load_cpu_kernels() is not None
    return weight.dtype == torch.bfloat16 and (
        load_cpu_kernels() is not None
        or (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")))


# what the kernel's output depends on besides the values: checked against F.linear once a process
# (a model's 100+ layers have five shapes; checking each layer cost seconds of every start)
_CHECKED_SHAPES: set[tuple] = set()


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None,
                stored_dtype: torch.dtype | None = None) -> PackedLinear | None:
    """A packed copy of the layer, or None where packing is unavailable or disagrees with F.linear.
    stored_dtype: see PackedLinear (the check then compares with F.linear on the stored weight)."""
    if not can_pack(weight):
        return None
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    try:
        packed = PackedLinear(weight, bias, load_cpu_kernels(), stored_dtype)
        shape = (*weight.shape, weight.dtype, packed.stored_dtype, bias is not None)
        if shape in _CHECKED_SHAPES:
            return packed
        if packed.stored_dtype != weight.dtype:  # what it multiplies by, widened back exactly
            weight = weight.to(packed.stored_dtype).to(weight.dtype)
        for rows in (3, 40):  # a decode-sized and a chunk-sized product: every tile shape of the kernel
            probe = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(weight.dtype)
            with torch.no_grad():
                expected, got = F.linear(probe, weight, bias).float(), packed(probe).float()
            # one rounding step of the largest output (bf16's or, for float32, a few of fp32's over K sums)
            # is the most an order of summation can move it
            step = 2 ** -7 if weight.dtype == torch.bfloat16 else 2 ** -16
            tolerance = step * expected.abs().max().item() + 1e-6
            if got.shape != expected.shape or (got - expected).abs().max().item() > tolerance:
                raise RuntimeError(f"packed output disagrees with F.linear at {rows} rows")
        _CHECKED_SHAPES.add(shape)
        return packed
    except Exception as e:  # private op missing or changed, a kernel that disagrees: the plain layer works everywhere
        logger.warning("weight packing unavailable, using plain %s matmuls: %s",
                       "bf16" if weight.dtype == torch.bfloat16 else "float32", e)
        return None


def pack_linears(module: nn.Module, stored_dtype: torch.dtype | None = None) -> int:
    """Replaces every nn.Linear under module with its packed form (stored_dtype: see PackedLinear);
    returns how many (0: none could be)."""
    # names, not the layers: a list holding every plain layer would keep all of them alive beside
    # their packed copies until the last is packed (twice the weights at the peak)
    targets = [(parent, name) for parent in module.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for count, (parent, name) in enumerate(targets):
        plain = getattr(parent, name)
        packed = pack_linear(plain.weight, plain.bias, stored_dtype)
        if packed is None:  # the first failure says packing does not work here
            return count
        del plain
        setattr(parent, name, packed)
    return len(targets)
