"""LSE combine on XLA in fp32: static, with the all -inf case handled by selects, not branches."""
from __future__ import annotations

import torch


def lse_combine(o_parts, lse_parts):
    """``[W, T, H, D]`` partial outputs and ``[W, T, H]`` fp32 LSEs -> (``[T, H, D]``, ``[T, H]``)."""
    # XLA's max-reduction starts from the lowest finite float, so an all -inf row would give a
    # finite peak: liveness comes from the parts themselves.
    finite = (lse_parts > float("-inf")).any(dim=0)  # [T, H]
    peak = lse_parts.amax(dim=0)
    shift = torch.where(finite, peak, torch.zeros_like(peak))
    weights = torch.exp(lse_parts - shift[None])  # exp(-inf) = 0: a -inf part contributes nothing
    total = weights.sum(dim=0)
    lse = torch.where(finite, torch.log(total) + shift, torch.full_like(peak, float("-inf")))
    norm = torch.where(finite, total, torch.ones_like(total))
    o = (weights[..., None] * o_parts.to(torch.float32)).sum(dim=0) / norm[..., None]
    return o.to(o_parts.dtype), lse
