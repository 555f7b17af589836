"""The plain-torch building blocks of the hybrid model: RMSNorm, rotary embedding, SwiGLU MLP.

Nothing here touches attention or the cache; those go through :mod:`dsahal.ops` only. Where the model's
fused kernels are on (CUDA, the graph-replayed decode path) the norms' and SwiGLU's elementwise chains run as
one Triton kernel each (:mod:`dsahal.model.fused`); the torch chains here are the CPU path and what those
kernels are tested against.
"""
from __future__ import annotations

import torch
from torch import nn

from . import fused
from .packed import project


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) · weight``, computed in fp32 and returned in x's dtype.

    x: ``[..., dim]`` any float dtype.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The norm of x in x's dtype; with ``residual`` (x's shape and dtype), of ``s = x + residual`` instead, and
        the pair ``(norm(s), s)`` is returned (the block's residual add fused with the next norm: one kernel on
        CUDA, :func:`dsahal.model.fused.rms_norm`)."""
        if fused.active(x, self.weight) and (residual is None or (residual.dtype == x.dtype
                                                                   and residual.shape == x.shape)):
            return fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            return self.normalize(x).to(x.dtype), x
        return self.normalize(x).to(x.dtype)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """The norm in fp32, before the cast back: ``F.rms_norm`` (one fused kernel on CUDA; on the CPU the
        same pow / mean / add / rsqrt / mul as written out) times the weight, which type promotion widens
        exactly without a cast of its own (a float64 weight is rounded to fp32, as the fp32 norm always did)."""
        weight = self.weight if self.weight.dtype.itemsize <= 4 else self.weight.float()
        return nn.functional.rms_norm(x.float(), self.weight.shape, eps=self.eps) * weight


class GatedRMSNorm(RMSNorm):
    """KDA's output norm: ``RMSNorm(o) · sigmoid(gate)`` per head (the gate is a low-rank projection).

    o, gate: ``[..., dim]``; the norm is over the last dim (one head's values).
    """

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if fused.active(x, gate, self.weight) and x.dim() == 3 and gate.shape == x.shape and gate.dtype == x.dtype:
            return fused.gated_rms_norm(x, gate, self.weight, self.eps)  # one kernel (dsahal.model.fused)
        normed = self.normalize(x)
        if x.dtype.itemsize < 4:  # a 16-bit x: the norm is rounded to it before the gate, as it always was
            normed = normed.to(x.dtype).float()
        return (normed * torch.sigmoid(gate.float())).to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, dim/2]`` fp32 for integer ``positions`` ``[T]`` (any int dtype)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.cos(angles), torch.sin(angles)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[i], x[i + dim/2])`` (the "rotate-half" layout) by the position's angles.

    x: ``[T, ..., dim]``; cos, sin: ``[T, dim/2]``. Returns x's shape and dtype.
    """
    half = x.shape[-1] // 2
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class SwiGLU(nn.Module):
    """Dense MLP ``down(silu(gate(x)) · up(x))``. x: ``[T, hidden]`` -> ``[T, hidden]``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(x, (self.gate, self.up))  # one matmul where the weights are packed
        return self.down(swiglu_act(gate, up))


def swiglu_act(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) · up`` (``[..., I]`` each, one dtype): one kernel with the fused kernels on
    (:func:`dsahal.model.fused.swiglu`)."""
    if fused.active(gate, up) and gate.dtype == up.dtype and gate.shape == up.shape:
        return fused.swiglu(gate, up)
    return nn.functional.silu(gate) * up
