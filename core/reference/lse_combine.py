"""Reference LSE combine in float64."""
from __future__ import annotations

import torch


def lse_combine(o_parts, lse_parts):
    lse_parts64 = lse_parts.double()
    lse = torch.logsumexp(lse_parts64, dim=0)  # [T, H]; -inf when every part is -inf
    finite = torch.isfinite(lse)
    weights = torch.where(finite[None], torch.exp(lse_parts64 - torch.where(finite, lse, 0.0)[None]), 0.0)
    o = (weights[..., None] * o_parts.double()).sum(dim=0)
    return o.to(o_parts.dtype), lse.float()
