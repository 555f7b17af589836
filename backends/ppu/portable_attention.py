"""Portable torch formulations of the attention ops for the PPU: sparse MLA and LSE combine.

Batched tensor code in fp32 (no per-token Python loop, no float64): what the PPU runs where no
Triton kernel of ``dsahal.backends.triton_kernels`` is registered for it. Any torch device
works, so the same functions are checked against the reference on the CPU.
"""
from __future__ import annotations

import torch

from dsahal.formats import LATENT_NOPE_DIM, latent_format

# Query rows per gather in sparse MLA: bounds the gathered [rows, K, 576] fp32 tile (~64K tokens).
SPARSE_MLA_GATHER_TOKENS = 1 << 16


def lse_combine(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``lse = log Σ_r exp(lse_r)``, ``o = Σ_r exp(lse_r − lse) · o_r``, in fp32.

    Args:
        o_parts: ``[W, T, H, D]`` fp32/bf16/fp16; lse_parts: ``[W, T, H]`` fp32.
    Returns:
        ``o`` ``[T, H, D]`` in o_parts' dtype, ``lse`` ``[T, H]`` fp32; all parts -inf gives 0, -inf.
    """
    if lse_parts.shape[0] == 0:  # no parts: no keys in any row (amax has nothing to reduce)
        return (o_parts.new_zeros(o_parts.shape[1:]),
                torch.full(lse_parts.shape[1:], float("-inf"), dtype=torch.float32, device=lse_parts.device))
    peak = lse_parts.amax(dim=0)  # [T, H]
    finite = torch.isfinite(peak)
    # Subtract the row's peak so exp never overflows; an all -inf row keeps weight 0 everywhere.
    shift = torch.where(finite, peak, torch.zeros_like(peak))
    weights = torch.exp(lse_parts - shift)  # [W, T, H], exactly 0 for -inf parts
    total = weights.sum(dim=0)
    lse = torch.where(finite, shift + torch.log(total), torch.full_like(peak, float("-inf")))
    o = torch.einsum("wth,wthd->thd", weights, o_parts.float())
    o = o / torch.where(finite, total, torch.ones_like(total))[..., None]
    return o.to(o_parts.dtype), lse


def _gather_latent(kv_pages, slots, kv_fmt, kv_scale) -> torch.Tensor:
    """Dequantised latent of every slot (-1 read as slot 0, masked by the caller): ``[*S, 576]`` fp32."""
    spec = latent_format(kv_fmt)
    flat = slots.reshape(-1).long().clamp_min(0)
    block_tokens = kv_pages.shape[1]
    records = kv_pages[flat // block_tokens, flat % block_tokens]
    return spec.unpack(records, kv_scale).float().reshape(*slots.shape, spec.dim)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """Absorbed MLA over each token's selected slots, batched over tokens and heads, fp32.

    Args:
        q: ``[T, H, 576]``; kv_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 in
        ``kv_fmt``; slots: ``[T, K]`` int32, -1 skipped; kv_scale: ``[]`` fp32 or None.
    Returns:
        ``o`` ``[T, H, 512]`` in q's dtype, ``lse`` ``[T, H]`` fp32 (0 and -inf for empty rows).
    """
    tokens, heads, _ = q.shape
    o = torch.zeros((tokens, heads, LATENT_NOPE_DIM), dtype=torch.float32, device=q.device)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32, device=q.device)
    rows_per_gather = max(1, SPARSE_MLA_GATHER_TOKENS // max(1, slots.shape[1]))
    for start in range(0, tokens, rows_per_gather):
        rows = slice(start, start + rows_per_gather)
        chosen = slots[rows]
        skipped = chosen < 0
        # A -1 slot was read as slot 0, which may hold any bytes (even NaN): zero it, since a zero
        # probability times NaN would still poison the output.
        kv = _gather_latent(kv_pages, chosen, kv_fmt, kv_scale).masked_fill(skipped[..., None], 0.0)  # [t, K, 576]
        logits = softmax_scale * torch.einsum("thd,tkd->thk", q[rows].float(), kv)
        logits = logits.masked_fill(skipped[:, None, :], float("-inf"))
        # shifted by each row's largest logit and normalised by the weights' own sum: exp(logit - lse) against an
        # fp32-rounded lse would not sum to 1 once |lse| is large (o off by 21% at logits near 2^23)
        peak = logits.amax(dim=-1) if logits.shape[-1] else torch.full(  # [t, H]; -inf for a row with no valid slot
            logits.shape[:-1], float("-inf"), device=logits.device)
        live = torch.isfinite(peak)
        weights = torch.exp(logits - torch.where(live, peak, torch.zeros_like(peak))[..., None])
        total = weights.sum(dim=-1)
        o[rows] = torch.einsum("thk,tkd->thd", weights, kv[..., :LATENT_NOPE_DIM]) / torch.where(
            live, total, torch.ones_like(total))[..., None]
        lse[rows] = torch.where(live, peak + torch.log(total), peak)  # (-inf for a row with no valid slot)
    return o.to(q.dtype), lse
