"""The decoder's fused elementwise steps: Formwork's CPU kernels on CPU tensors, torch elsewhere.

Both paths compute the same thing; the kernels (engine/kernels/csrc/fused_ops.cpp) do it in one pass, in
fp32, without waking OpenMP threads for a decode batch. CUDA tensors (and CPUs where the kernels
could not be built) take the torch path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.loader import load_cpu_kernels


def _kernels_for(t: torch.Tensor):
    return load_cpu_kernels() if t.device.type == "cpu" else None


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """residual += delta (in place, when given); returns rms_norm(residual) * weight."""
    kernels = _kernels_for(residual)
    if kernels is not None:
        return kernels.add_rms_norm(residual, delta, weight, eps)
    if delta is not None:
        residual.add_(delta)
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2I] (gate, then up) -> silu(gate) * up: [n, I]."""
    kernels = _kernels_for(gate_up)
    if kernels is not None:
        return kernels.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_rotated: int, head_dim: int) -> None:
    """Rotates the first num_rotated heads of each row in place: x * cos + rotate_half(x) * sin.

    qkv: [n, width] with rows of heads (queries, then keys, then what is not rotated); cos, sin: [n, head_dim]."""
    kernels = _kernels_for(qkv)
    if kernels is not None:
        kernels.rotary_(qkv, cos, sin, num_rotated, head_dim)
        return
    x = qkv[:, :num_rotated * head_dim].view(-1, num_rotated, head_dim)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    x.copy_(x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1))
