"""Plain-torch compositions of the ops (what a model would write without custom kernels).

Batched tensor code on the GPU, bf16 matmuls where the model would use them; the baseline each
op's "vs torch" ratio is measured against (docs/performance.md). Not the oracle: the
correctness checks compare against :mod:`dsahal.reference`.
"""
from __future__ import annotations

import torch

from ..formats import index_format, latent_format


def _dequant_rows(pages: torch.Tensor, slots: torch.Tensor, spec, scale=None) -> torch.Tensor:
    flat = pages.reshape(-1, pages.shape[-1])
    return spec.unpack(flat[slots.reshape(-1).clamp_min(0)], scale).reshape(*slots.shape, spec.dim)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """Decode-shaped: ``T`` tokens whose requests' keys are gathered densely; fp32 out ``[T, max_context]``."""
    spec = index_format(index_fmt)
    block_tokens = index_pages.shape[1]
    pos = torch.arange(max_context, device=q.device)
    blocks = block_table.long()[:, pos // block_tokens]  # [B, ctx]
    slots = blocks * block_tokens + pos % block_tokens
    keys = _dequant_rows(index_pages, slots, spec).to(torch.bfloat16)  # [B, ctx, 128]
    requests, tokens = block_table.shape[0], q.shape[0]
    # Decode batches are request-major with the same number of tokens per request.
    per_request = tokens // requests
    q4 = q.to(torch.bfloat16).reshape(requests, per_request, q.shape[1], q.shape[2])
    logits = torch.einsum("bthd,bsd->bths", q4, keys).float()  # [B, t, H, ctx]
    scores = (torch.relu(logits) * weights.reshape(requests, per_request, -1, 1)).sum(dim=2).reshape(tokens, -1)
    visible = (pos[None, :] <= positions[:, None].long()) & (blocks[req_ids.long()] >= 0)
    return torch.where(visible, scores, float("-inf"))


def topk(scores, lengths, k):
    cols = torch.arange(scores.shape[1], device=scores.device)
    masked = torch.where(cols[None, :] < lengths[:, None], scores, float("-inf"))
    values, idx = torch.topk(masked, min(k, scores.shape[1]), dim=1)
    return torch.where(values == float("-inf"), -1, idx).to(torch.int32)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    spec = latent_format(kv_fmt)
    kv = _dequant_rows(kv_pages, slots, spec, kv_scale).to(q.dtype)  # [T, K, 576]
    logits = torch.einsum("thd,tkd->thk", q, kv).float() * softmax_scale
    logits = logits.masked_fill((slots < 0)[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    o = torch.einsum("thk,tkd->thd", p.to(q.dtype), kv[..., :512])
    return o, lse


def lse_combine(o_parts, lse_parts):
    lse = torch.logsumexp(lse_parts, dim=0)
    weights = torch.exp(lse_parts - lse[None]).nan_to_num(0.0)
    return (weights[..., None] * o_parts.float()).sum(0).to(o_parts.dtype), lse


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    ids = state_ids.long()
    state = state_pool[ids]
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    state = state * torch.exp(g.float())[..., None]
    u = beta.float()[..., None] * (v.float() - torch.einsum("bhkv,bhk->bhv", state, kf))
    state = state + kf[..., None] * u[..., None, :]
    state_pool[ids] = state
    return torch.einsum("bhkv,bhk->bhv", state, scale * qf).to(q.dtype)


def dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                  kv_fmt, kv_scale, topk_k, max_context, softmax_scale):
    scores = indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                           max_context)
    chosen = topk(scores, positions.to(torch.int32) + 1, topk_k).long()
    block_tokens = index_pages.shape[1]
    blocks = block_table.long()[req_ids.long()[:, None], chosen.clamp_min(0) // block_tokens]
    slots = torch.where(chosen >= 0, blocks * block_tokens + chosen.clamp_min(0) % block_tokens, -1)
    return sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
