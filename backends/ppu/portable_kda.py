"""Portable torch formulations of KDA for the PPU: the batched decode step and the chunked prefill.

fp32 throughout (the state pool is fp32). Per head, state ``S`` ``[K, V]``::

    S <- S ⊙ exp(g_t)[:, None];  u_t = β_t (v_t − Sᵀ k_t);  S <- S + k_t u_tᵀ;  o_t = Sᵀ (scale q_t)

The prefill processes CHUNK_SIZE tokens at a time with the WY-style solve of the chunked form
(see ``dsahal.reference.kda`` for the derivation): decay differences are formed pairwise as
``exp(G_i − G_j)`` with ``j <= i``, never as ``exp(−G)``, so strong decays cannot overflow; a gate of ``-inf``
(a full reset, as in a decode step) is taken as :data:`RESET_GATE`, whose fp32 exponential is 0 too.
"""
from __future__ import annotations

import torch

from dsahal.ops.kda import L2NORM_EPS

CHUNK_SIZE = 64
# exp(-110) is 0.0 in fp32 (its smallest subnormal is ~e^-103): the same full reset as a -inf gate, finite, so the
# pairwise decay differences stay finite (-inf - (-inf) is NaN)
RESET_GATE = -110.0


def _normalised(x: torch.Tensor, enabled: bool) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS) if enabled else x


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    """One step for a batch of requests; states updated in place at ``state_ids`` (-1: padding).

    Args:
        q, k, g: ``[B, H, K]``; v: ``[B, H, V]``; beta: ``[B, H]``; state_pool: ``[P, H, K, V]`` fp32.
    Returns:
        ``[B, H, V]`` in q's dtype, zeros for padding requests.
    """
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    live = state_ids >= 0
    ids = state_ids[live].long()
    if ids.numel() == 0:
        return out.to(q.dtype)
    queries, keys = _normalised(q[live], use_qk_l2norm), _normalised(k[live], use_qk_l2norm)
    state = state_pool[ids] * torch.exp(g[live].float())[..., None]  # [b, H, K, V]
    delta = beta[live].float()[..., None] * (v[live].float() - torch.einsum("bhkv,bhk->bhv", state, keys))
    state = state + keys[..., None] * delta[..., None, :]
    out[live] = torch.einsum("bhkv,bhk->bhv", state, scale * queries)
    state_pool[ids] = state
    return out.to(q.dtype)


def _chunk(state, q, k, v, g, beta, scale):
    """One chunk, all heads. state ``[H, K, V]``; q, k, g ``[H, C, K]``; v ``[H, C, V]``; beta ``[H, C]``."""
    size = q.shape[1]
    cum = torch.cumsum(g.clamp_min(RESET_GATE), dim=1)  # G_i per channel
    decay = torch.exp((cum[:, :, None, :] - cum[:, None, :, :]).clamp_max(0.0))  # [H, C, C, K]
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    strictly = causal.tril(diagonal=-1)
    interaction = beta[..., None] * torch.einsum("hic,hjc,hijc->hij", k, k, decay) * strictly
    rhs = beta[..., None] * (v - torch.einsum("hic,hcv->hiv", k * torch.exp(cum), state))
    eye = torch.eye(size, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(eye + interaction, rhs, upper=False, unitriangular=True)
    attend = torch.einsum("hic,hjc,hijc->hij", q, k, decay) * causal
    o = scale * (torch.einsum("hic,hcv->hiv", q * torch.exp(cum), state) + attend @ u)
    last = cum[:, -1:, :]
    state = torch.exp(last[:, 0, :, None]) * state + torch.einsum("hjc,hjv->hcv", k * torch.exp(last - cum), u)
    return state, o


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """Chunked prefill of sequences packed along T (``cu_seqlens`` offsets), from and back to the pool.

    Args:
        q, k, g: ``[T, H, K]``; v: ``[T, H, V]``; beta: ``[T, H]``; cu_seqlens: ``[B + 1]``;
        state_pool: ``[P, H, K, V]`` fp32; state_ids: ``[B]`` (-1: start from zero, write nothing).
    Returns:
        ``[T, H, V]`` in q's dtype.
    """
    heads_first = [x.float().transpose(0, 1) for x in (_normalised(q, use_qk_l2norm), _normalised(k, use_qk_l2norm),
                                                       v, g, beta)]
    queries, keys, values, decays, betas = heads_first  # [H, T, ...]
    out = torch.zeros((v.shape[1], v.shape[0], v.shape[2]), dtype=torch.float32, device=v.device)
    bounds = cu_seqlens.tolist()
    for seq, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        sid = int(state_ids[seq])
        state = state_pool[sid].float() if sid >= 0 else v.new_zeros((q.shape[1], q.shape[2], v.shape[2]),
                                                                     dtype=torch.float32)
        for start in range(begin, end, CHUNK_SIZE):
            part = slice(start, min(end, start + CHUNK_SIZE))
            state, out[:, part] = _chunk(state, queries[:, part], keys[:, part], values[:, part], decays[:, part],
                                         betas[:, part], scale)
        if sid >= 0 and end > begin:
            state_pool[sid] = state
    return out.transpose(0, 1).to(q.dtype)
