"""``lse_combine`` in plain torch: merge attention computed over disjoint key sets.

Contract (``dsahal.ops.lse_combine``): partial results ``(o_r, lse_r)`` of ``W`` shards merge to
``lse = log Σ_r exp(lse_r)`` and ``o = Σ_r exp(lse_r − lse) · o_r``; a ``-inf`` partial adds
nothing; all ``-inf`` gives ``o = 0``, ``lse = -inf``.

Like many kernels, this one flattens its inputs with ``view`` and so needs contiguous tensors;
its verifier says so, and dsahal runs non-contiguous calls on the reference instead.
"""
from __future__ import annotations

import torch


def verify_lse_combine(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[bool, str]:
    """``(ok, reason)`` from metadata only: a verifier runs before every call, so it must never
    read tensor values (that would synchronise a GPU)."""
    if not (o_parts.is_contiguous() and lse_parts.is_contiguous()):
        return False, "needs contiguous o_parts and lse_parts (it flattens them with view)"
    return True, ""


def lse_combine(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Args:
        o_parts: ``[W, T, H, D]`` fp32/bf16/fp16, contiguous.
        lse_parts: ``[W, T, H]`` fp32, contiguous.

    Returns:
        ``o`` ``[T, H, D]`` in o_parts' dtype, ``lse`` ``[T, H]`` fp32.
    """
    parts, tokens, heads, dim = o_parts.shape
    o_rows = o_parts.view(parts, tokens * heads, dim).float()  # [W, R, D], one row per (token, head)
    lse_rows = lse_parts.view(parts, tokens * heads)  # [W, R]
    lse = torch.logsumexp(lse_rows, dim=0)  # [R]; -inf when every part is -inf
    # exp(lse_r - lse) is each part's share; a row with no live part would give nan, so use 0.
    live = torch.isfinite(lse)
    share = torch.where(live, torch.exp(lse_rows - torch.where(live, lse, 0.0)), 0.0)  # [W, R]
    o = torch.einsum("wr,wrd->rd", share, o_rows)
    return o.view(tokens, heads, dim).to(o_parts.dtype), lse.view(tokens, heads)
