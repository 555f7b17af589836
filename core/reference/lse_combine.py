"""Reference LSE combine in float64."""
from __future__ import annotations

import torch


def lse_combine(o_parts, lse_parts):
    lse_parts64 = lse_parts.double()
    # each part weighted by exp(lse_r - the largest), the sum normalised by the weights' own total: weighting by
    # exp(lse_r - lse) against a rounded lse is off once |lse| is large (at 1e30, lse + log 2 rounds to lse and two
    # equal parts summed instead of averaged)
    peak = lse_parts64.amax(dim=0) if lse_parts64.shape[0] else torch.full(  # [T, H]; no part: -inf
        lse_parts64.shape[1:], float("-inf"), dtype=torch.float64, device=lse_parts64.device)
    finite = torch.isfinite(peak)  # -inf: every part empty (o = 0, lse = -inf)
    weights = torch.exp(lse_parts64 - torch.where(finite, peak, 0.0)[None])  # -inf parts: 0
    total = weights.sum(dim=0)
    o = torch.where(finite[..., None], (weights[..., None] * o_parts.double()).sum(dim=0)
                    / torch.where(finite, total, 1.0)[..., None], 0.0)
    lse = torch.where(finite, peak + torch.log(total), peak)
    return o.to(o_parts.dtype), lse.float()
