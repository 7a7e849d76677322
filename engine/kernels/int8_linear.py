"""int8 linear layers on CPU (`--quantization int8`), through the kernels' int8 GEMM.

A weight is quantized once, when the model loads, to int8 with one fp32 scale per output channel
(max|w| / 127), or taken as it is from a GGUF file's Q8_0 blocks (one fp16 scale per 32 values, the
file's own, widened in the kernels; `from_q8_0`). It is held once, in the GEMM's layout
(engine/kernels/csrc/int8_gemm.h); the float weight is dropped. Each call quantizes x dynamically,
per token and group of 64 values (32 beside Q8_0 weights, to match their scales; a scale per token
alone lets one outlier channel flatten the rest of the row: greedy agreement with the unquantized
default model fell under 90%), sums the products of each group in int32 and scales them back in
fp32; the output is in x's dtype (or fp32 for the logits). The int32 sums are exact, so a row's
output does not depend on the other rows of the batch, nor on which kernel (AVX-512 VNNI, AVX2,
portable) computed it.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from engine.kernels.loader import load_cpu_kernels
from engine.kernels.quantized_linear import QuantizedLinear, tensor_bytes

logger = logging.getLogger(__name__)

BLOCK_COLUMNS = 16  # output columns per block of the layout
GROUP = 32  # values of K per weight scale in GGUF Q8_0 (and per activation scale beside them)
ACTIVATION_GROUP = 64  # values of K per activation scale beside per-channel weights


class Int8Linear(QuantizedLinear):
    """y = x @ W.T + b with W held once as int8 plus its scales (fp32 per channel, or Q8_0's fp16 per 32
    values), in the int8 GEMM's layout."""

    format = "int8"

    def __init__(self, packed: tuple[torch.Tensor, torch.Tensor], out_features: int,
                 in_features: int, bias: torch.Tensor | None, dtype: torch.dtype, kernels) -> None:
        super().__init__(*packed, out_features, in_features, bias, dtype, kernels)
        # what a forward reads: the int8 values, their scales, the bias (roofline figures)
        self.weight_bytes = (out_features * (in_features + self.scales.element_size() * self.scales.shape[1])
                             + tensor_bytes(self.bias))

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, kernels) -> Int8Linear:
        """Quantized per output channel: w ~ round(w * 127 / max|w_row|) * max|w_row| / 127."""
        out_features, in_features = weight.shape
        return cls(tuple(kernels.pack_int8_weight(weight.detach())), out_features, in_features, bias,
                   weight.dtype, kernels)

    @classmethod
    def from_q8_0(cls, rows: torch.Tensor, out_features: int, in_features: int, dtype: torch.dtype,
                  kernels) -> Int8Linear:
        """From a GGUF Q8_0 tensor's bytes, [out_features, in_features / 32 * 34]: its int8 values
        re-laid as they are, its per-block fp16 scales kept as they are."""
        return cls(tuple(kernels.pack_q8_0_weight(rows, in_features)), out_features, in_features, None, dtype,
                   kernels)

    def multiply(self, x: torch.Tensor, fp32_out: bool) -> torch.Tensor:
        return self.kernels.int8_gemm(x, self.packed_weight, self.scales, self.out_features, self.bias, fp32_out)

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids] as the kernel multiplies by it (int8 values times their scales), in float32."""
        ids = ids.long()
        blocks, columns = ids // BLOCK_COLUMNS, ids % BLOCK_COLUMNS
        values = self.packed_weight[blocks, :, columns, :]  # [*ids, quads, 4], stored as w + 128
        values = values.reshape(*ids.shape, -1)[..., :self.in_features].float() - 128
        scales = self.scales[blocks, :, columns].float()  # [*ids, groups]
        group = values.shape[-1] if scales.shape[-1] == 1 else GROUP
        return values * scales.repeat_interleave(group, dim=-1)[..., :self.in_features]

def int8_unsupported_reason(weight: torch.Tensor) -> str | None:
    """Why the int8 GEMM cannot take this weight here, or None when it can."""
    if weight.device.type != "cpu":
        return f"int8 weights run on CPU only, this one is on {weight.device.type}"
    if load_cpu_kernels() is None:
        return "int8 needs Formwork's CPU kernels, which could not be built here (see the warning above)"
    if weight.shape[1] % GROUP:
        return (f"its {weight.shape[1]} input features are not a multiple of {GROUP}, the int8 GEMM's "
                "group of values per scale")
    return None


def _refusal(name: str, reason: str) -> ValueError:
    return ValueError(f"--quantization int8: layer {name} cannot be quantized: {reason}; "
                      "--quantization int8:lenient serves such layers unquantized")


def quantize_linear(name: str, weight: torch.Tensor, bias: torch.Tensor | None, lenient: bool) -> Int8Linear | None:
    """weight (and bias) as an Int8Linear; None, with a warning, where it cannot be one and lenient
    is set; ValueError naming the layer where it cannot and lenient is not set."""
    reason = int8_unsupported_reason(weight)
    if reason is None:
        return Int8Linear.from_weight(weight, bias, load_cpu_kernels())
    if not lenient:
        raise _refusal(name, reason)
    logger.warning("layer %s stays unquantized: %s", name, reason)
    return None


def quantize_linears(module: nn.Module, lenient: bool, prefix: str = "") -> tuple[int, list[str]]:
    """Replaces every nn.Linear under module with its Int8Linear, each float weight dropped once
    quantized; returns (how many, the names of those left in float). Without lenient, a layer that
    cannot be quantized raises ValueError naming it before any layer changes."""
    targets = [(".".join(filter(None, (prefix, parent_name, name))), parent, name)
               for parent_name, parent in module.named_modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    if not lenient:
        for full_name, parent, name in targets:
            if reason := int8_unsupported_reason(getattr(parent, name).weight):
                raise _refusal(full_name, reason)
    left: list[str] = []
    for full_name, parent, name in targets:
        plain = getattr(parent, name)
        quantized = quantize_linear(full_name, plain.weight, plain.bias, lenient)
        if quantized is None:
            left.append(full_name)
            continue
        del plain
        setattr(parent, name, quantized)
    return len(targets) - len(left), left
