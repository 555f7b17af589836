"""Reference KDA in float64: the recurrent form (the definition) and the chunked form.

Recurrent, per head (state S ``[K, V]``)::

    S <- S ⊙ exp(g_t)[:, None];  u_t = β_t (v_t − Sᵀ k_t);  S <- S + k_t u_tᵀ;  o_t = Sᵀ (scale q_t)

Chunked (chunk of C tokens from state S₀, ``G_i = Σ_{j≤i} g_j`` per channel): unrolling the
recurrence gives ``S_i = Γ_i (S₀ + Σ_{j≤i} Γ_j⁻¹ k_j u_jᵀ)`` with ``Γ_i = diag(exp G_i)``, hence

    (I + A) U = diag(β) (V − (K ⊙ e^{G}) S₀),   A_ij = β_i Σ_c k_ic k_jc e^{G_ic − G_jc}  (j < i)
    o_i  = scale (S₀ᵀ (q_i ⊙ e^{G_i}) + Σ_{j≤i} u_j Σ_c q_ic k_jc e^{G_ic − G_jc})
    S_C  = e^{G_C} ⊙ S₀ + Σ_j (k_j ⊙ e^{G_C − G_j}) u_jᵀ

Decay differences are formed pairwise (``G_i − G_j ≤ 0`` for ``j ≤ i``), never as ``e^{−G}``,
so strong decays do not overflow. A gate of ``-inf`` (``exp(g) = 0``: the channel forgets its state, as a
decode step does) is taken as :data:`RESET_GATE` there, whose exponential is 0 as well: ``-inf - (-inf)``
would be NaN in the pairwise differences.
"""
from __future__ import annotations

import torch

L2NORM_EPS = 1e-6  # fla's use_qk_l2norm: x / sqrt(sum(x^2) + 1e-6); dsahal.ops.kda documents the same

CHUNK_SIZE = 64
# exp(-1000) is exactly 0.0 in float64 (its smallest subnormal is ~e^-745), so a gate at or below it is the same
# full reset as -inf; finite, it keeps the chunked form's pairwise differences finite (and a sum of a chunk's worth
# of such gates, -64000, keeps ~1e-11 of absolute precision for the gates after it)
RESET_GATE = -1000.0


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _prepare(q, k, use_qk_l2norm):
    q, k = q.double(), k.double()
    if use_qk_l2norm:
        q, k = l2_normalise(q), l2_normalise(k)
    return q, k


def recurrent_step(state, q, k, v, g, beta, scale):
    """One token for a batch of heads. state ``[..., K, V]``; q, k, g ``[..., K]``; v ``[..., V]``;
    beta ``[...]``. Returns (new state, output ``[..., V]``), all float64."""
    state = state * torch.exp(g)[..., :, None]
    u = beta[..., None] * (v - torch.einsum("...kv,...k->...v", state, k))
    state = state + k[..., :, None] * u[..., None, :]
    return state, torch.einsum("...kv,...k->...v", state, scale * q)


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    q64, k64 = _prepare(q, k, use_qk_l2norm)
    live = state_ids >= 0
    out = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    if bool(live.any()):
        ids = state_ids[live].long()
        state, o = recurrent_step(state_pool[ids].double(), q64[live], k64[live], v[live].double(),
                                  g[live].double(), beta[live].double(), scale)
        state_pool[ids] = state.float()
        out[live] = o
    return out.to(q.dtype)


def _chunk(state, q, k, v, g, beta, scale):
    """One chunk for all heads. state ``[H, K, V]``; q, k, g ``[C, H, K]``; v ``[C, H, V]``; beta ``[C, H]``."""
    q, k, v, g, beta = (x.transpose(0, 1) for x in (q, k, v, g.clamp_min(RESET_GATE), beta))  # heads first
    chunk = q.shape[1]
    cum = torch.cumsum(g, dim=1)  # [H, C, K]
    pair = torch.exp((cum[:, :, None, :] - cum[:, None, :, :]).clamp_max(0.0))  # e^{G_i - G_j}, [H, C, C, K]
    strictly_lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), diagonal=-1)
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device))
    a = beta[:, :, None] * torch.einsum("hic,hjc,hijc->hij", k, k, pair) * strictly_lower
    rhs = beta[:, :, None] * (v - torch.einsum("hic,hcv->hiv", k * torch.exp(cum), state))
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)  # [H, C, V]
    qk = torch.einsum("hic,hjc,hijc->hij", q, k, pair) * lower
    o = scale * (torch.einsum("hic,hcv->hiv", q * torch.exp(cum), state) + qk @ u)
    last = cum[:, -1:, :]  # G_C
    state = torch.exp(last[:, 0, :, None]) * state + torch.einsum("hjc,hjv->hcv", k * torch.exp(last - cum), u)
    return state, o.transpose(0, 1)


def chunked_sequence(state, q, k, v, g, beta, scale, chunk_size=CHUNK_SIZE):
    """A whole sequence in chunks, float64. q ``[L, H, K]``... state ``[H, K, V]``. Returns (state, o)."""
    outputs = []
    for start in range(0, q.shape[0], chunk_size):
        end = start + chunk_size
        state, o = _chunk(state, q[start:end], k[start:end], v[start:end], g[start:end], beta[start:end], scale)
        outputs.append(o)
    o = torch.cat(outputs) if outputs else v.new_zeros(v.shape)
    return state, o


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    q64, k64 = _prepare(q, k, use_qk_l2norm)
    out = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    bounds = cu_seqlens.tolist()
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        sid = int(state_ids[b])
        if sid >= 0:
            state = state_pool[sid].double()
        else:
            state = torch.zeros((heads, key_dim, value_dim), dtype=torch.float64, device=v.device)
        if end == start:
            continue
        state, o = chunked_sequence(state, q64[start:end], k64[start:end], v[start:end].double(),
                                    g[start:end].double(), beta[start:end].double(), scale)
        out[start:end] = o
        if sid >= 0:
            state_pool[sid] = state.float()
    return out.to(q.dtype)


def kda_recurrent_sequence(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """The definition, token by token (used by tests to check the chunked form).
    q ``[L, H, K]``, state ``[H, K, V]``; returns (state, o ``[L, H, V]``) float64."""
    q64, k64 = _prepare(q, k, use_qk_l2norm)
    state = state.double()
    outputs = []
    for t in range(q.shape[0]):
        state, o = recurrent_step(state, q64[t], k64[t], v[t].double(), g[t].double(), beta[t].double(), scale)
        outputs.append(o)
    return state, torch.stack(outputs) if outputs else v.new_zeros(v.shape).double()
