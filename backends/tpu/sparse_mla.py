"""Sparse MLA on XLA: gather the selected latents into a dense buffer, then dense attention.

The seed's TPU split: the SparseCore gathers each query's top-k latents from the paged cache
into a dense ``[tokens, k, 576]`` buffer, the TensorCore's MXU runs ordinary attention over
it. Here both halves are XLA ops (a gather, then batched matmuls); -1 slots are masked to -inf
logits, so the shape is always ``[tokens, k]`` whatever the number of valid slots.
"""
from __future__ import annotations

import torch

from dsahal.formats import LATENT_DIM, LATENT_NOPE_DIM

from .buckets import token_tiles
from .cache import read_tokens


def attend_tile(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """q ``[t, H, 576]``, slots ``[t, K]`` -> (o ``[t, H, 512]`` fp32, lse ``[t, H]`` fp32)."""
    kv, valid = read_tokens(kv_pages, slots, "latent", kv_fmt, kv_scale)  # [t, K, 576]
    # A -1 slot read slot 0, whose bytes may be anything (NaN included): zero it so a masked
    # column contributes 0 * 0, not 0 * NaN, to the output.
    kv = torch.where(valid[..., None], kv, torch.zeros_like(kv))
    logits = softmax_scale * torch.einsum("thd,tkd->thk", q.to(torch.float32), kv)
    logits = torch.where(valid[:, None, :], logits, torch.full_like(logits, float("-inf")))
    peak = logits.amax(dim=-1)  # [t, H]
    # Not isfinite(peak): XLA's max-reduction of an all -inf row is the lowest finite float.
    live = valid.any(dim=-1)[:, None].expand_as(peak)
    shift = torch.where(live, peak, torch.zeros_like(peak))
    weights = torch.exp(logits - shift[..., None])
    total = weights.sum(dim=-1)
    o = torch.einsum("thk,tkd->thd", weights, kv[..., :LATENT_NOPE_DIM])
    o = o / torch.where(live, total, torch.ones_like(total))[..., None]
    lse = torch.where(live, torch.log(total) + shift, torch.full_like(peak, float("-inf")))
    return o, lse


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """q ``[T, H, 576]``, slots ``[T, K]`` -> (o ``[T, H, 512]`` in q's dtype, lse ``[T, H]`` fp32)."""
    tokens, heads, _ = q.shape
    width = slots.shape[1]
    if tokens == 0 or width == 0:
        o = q.new_zeros((tokens, heads, LATENT_NOPE_DIM))
        return o, q.new_full((tokens, heads), float("-inf"), dtype=torch.float32)
    outputs, lses = [], []
    for tile in token_tiles(tokens, width * max(heads, LATENT_DIM)):
        o, lse = attend_tile(q[tile], kv_pages, slots[tile], kv_fmt, kv_scale, softmax_scale)
        outputs.append(o)
        lses.append(lse)
    o = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    lse = lses[0] if len(lses) == 1 else torch.cat(lses)
    return o.to(q.dtype), lse
