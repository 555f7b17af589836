"""LSE combine: merge partial attention over disjoint key sets into attention over their union."""
from __future__ import annotations

import torch

from ..registry.state import active_table
from ._dispatch import tracing
from ._validate import FLOAT_DTYPES, ShapeBinder

OP = "lse_combine"


@torch.library.custom_op("dsahal::lse_combine", mutates_args=())
def _lse_combine_op(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return active_table().dispatch[OP](o_parts, lse_parts)


@_lse_combine_op.register_fake
def _(o_parts, lse_parts):
    return o_parts.new_empty(o_parts.shape[1:]), lse_parts.new_empty(lse_parts.shape[1:])


_Tensor, _FP32 = torch.Tensor, torch.float32


def validate_lse_combine(o_parts, lse_parts) -> None:
    # Every check below in one expression for the common, valid call (it accepts exactly what they
    # accept, for plain tensors): validation is on the eager hot path. Anything else, a tensor subclass
    # included, takes the full checks, which raise the documented errors.
    if (o_parts.__class__ is _Tensor and lse_parts.__class__ is _Tensor and o_parts.dtype in FLOAT_DTYPES
            and lse_parts.dtype is _FP32 and o_parts.dim() == 4 and lse_parts.shape == o_parts.shape[:3]
            and o_parts.device == lse_parts.device):
        return
    v = ShapeBinder(OP)
    v.tensor("o_parts", o_parts, ("W", "T", "H", None), FLOAT_DTYPES)
    v.tensor("lse_parts", lse_parts, ("W", "T", "H"), torch.float32)
    v.same_device(o_parts=o_parts, lse_parts=lse_parts)


def lse_combine(
    o_parts: torch.Tensor, lse_parts: torch.Tensor, *, check: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lse = log Σ_r exp(lse_r)``, ``o = Σ_r exp(lse_r - lse) · o_r``.

    Args:
        o_parts: ``[W, T, H, D]`` fp32/bf16/fp16 partial outputs.
        lse_parts: ``[W, T, H]`` fp32 natural-log partial LSEs; -inf parts contribute nothing. A part
            of +inf or NaN is outside the contract (backends differ there).

    Returns:
        ``o``: ``[T, H, D]`` in o_parts' dtype; ``lse``: ``[T, H]`` fp32. All parts -inf gives
        ``o = 0``, ``lse = -inf``.
    """
    if check:
        validate_lse_combine(o_parts, lse_parts)
    if tracing():
        return torch.ops.dsahal.lse_combine(o_parts, lse_parts)
    return active_table().dispatch[OP](o_parts, lse_parts)
