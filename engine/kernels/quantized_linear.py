"""What the int8 and 4-bit linear layers share: a weight held once in a GEMM's packed layout with its
scales, an fp32 bias added to the sums, and the activations' dtype kept in and out."""
from __future__ import annotations

import torch
from torch import nn


class QuantizedLinear(nn.Module):
    """y = x @ W.T + b through a CPU kernel's quantized GEMM; subclasses name the GEMM (`multiply`)
    and how a row of W reads back (`dequantized_rows`)."""

    format = ""  # the layout's name in the kernels' Projection: "int8" or "int4"

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, out_features: int, in_features: int,
                 bias: torch.Tensor | None, dtype: torch.dtype, kernels) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.packed_weight, self.scales = packed, scales
        self.bias = None if bias is None else bias.detach().float().contiguous()  # added to the fp32 sums
        self.dtype = dtype  # of the activations: rows() hands back this dtype
        self.kernels = kernels

    def multiply(self, x: torch.Tensor, fp32_out: bool) -> torch.Tensor:
        """The GEMM on 2-D x with contiguous rows: bf16 or fp32 out (fp32 with fp32_out)."""
        raise NotImplementedError

    def kernel_projection(self):
        """This layer as the kernels' fused decoder layer takes a matmul (their Projection): the GEMM
        call forward makes. None for float16 activations, whose output forward narrows from fp32."""
        if self.dtype not in (torch.bfloat16, torch.float32):
            return None
        return self.kernels.Projection(self.format, self.packed_weight, self.scales, self.bias)

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as the kernel multiplies by it, in float32."""
        raise NotImplementedError

    @property
    def resident_bytes(self) -> int:
        """Bytes this layer holds (the packed values with their padding, scales, bias)."""
        return sum(tensor_bytes(t) for t in (self.packed_weight, self.scales, self.bias))

    @property
    def shares_rows(self) -> bool:
        """rows() reads the weight back (dequantized): a tied embedding can look its rows up here."""
        return True

    def forward(self, x: torch.Tensor, fp32_out: bool = False) -> torch.Tensor:
        """x @ W.T (+ bias) in x's dtype; fp32_out: in float32, the scaled sums unrounded."""
        flat = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, x.shape[-1]).contiguous()
        y = self.multiply(flat, fp32_out)
        if not fp32_out and y.dtype != x.dtype:  # the kernels write bf16 or fp32
            y = y.to(x.dtype)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] dequantized, in the activations' dtype (an embedding lookup)."""
        return self.dequantized_rows(ids).to(self.dtype)


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()
