"""KDA recurrent step over a pooled per-request state (decode, and token-by-token prefill).

Per head, state ``S [K, V]`` fp32::

    S <- S ⊙ exp(g_t)[:, None];  u = β_t (v_t − Sᵀ k_t);  S <- S + k_t uᵀ;  o_t = Sᵀ (scale q_t)

One program owns the ``[K, BLOCK_V]`` column slab of one (sequence, head) state: it reads the
slab once, runs every token of its sequence, writes it back once. Decode is the case of one
token per sequence; it is memory-bound on the state (read + write 2 · K · V · 4 bytes per head),
so the slab is sized to keep enough bytes in flight. State id -1 (or out of range) means a
padding request: decode writes a zero output and no state; prefill starts from zero and writes
no state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def kda_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # q, k, g [N, H, K]; v [N, H, V]; beta [N, H] (token-major)
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_gn, stride_gh, stride_bn, stride_bh,
    out_ptr, stride_on, stride_oh,  # [N, H, V]
    state_ptr, stride_sp, stride_sh, stride_sk,  # state pool [P, H, K, V] fp32 (unit stride in V)
    ids_ptr,  # [B] state ids
    cu_ptr,  # [B + 1] token offsets (VARLEN) — decode uses token b for sequence b
    H, K, V, P, scale,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, VARLEN: tl.constexpr, L2NORM: tl.constexpr,
    ZERO_PADDING_OUTPUT: tl.constexpr,
):
    pid_v = tl.program_id(0)
    seq = tl.program_id(1) // H
    h = tl.program_id(1) % H
    ks = tl.arange(0, BLOCK_K)
    vs = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ks < K
    v_ok = vs < V
    slab_ok = k_ok[:, None] & v_ok[None, :]

    # The id is broadcast to the slab's V lanes: masks are then plain tensors (the interpreter
    # mishandles tensor & scalar masks).
    sid = tl.load(ids_ptr + seq + 0 * vs).to(tl.int64)
    live = (sid >= 0) & (sid < P)
    slab_ok = slab_ok & live[None, :]
    slab = state_ptr + tl.where(live, sid, 0)[None, :] * stride_sp + h * stride_sh + ks[:, None] * stride_sk \
        + vs[None, :]
    state = tl.load(slab, mask=slab_ok, other=0.0)

    if VARLEN:
        start = tl.load(cu_ptr + seq).to(tl.int64)
        end = tl.load(cu_ptr + seq + 1).to(tl.int64)
    else:
        start = seq.to(tl.int64)
        end = start + 1
    for n in range(start, end):
        q = tl.load(q_ptr + n * stride_qn + h * stride_qh + ks, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + n * stride_kn + h * stride_kh + ks, mask=k_ok, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + n * stride_gn + h * stride_gh + ks, mask=k_ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + n * stride_vn + h * stride_vh + vs, mask=v_ok, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + n * stride_bn + h * stride_bh).to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        state = state * tl.exp(g)[:, None]
        u = beta * (v - tl.sum(state * k[:, None], axis=0))
        state = state + k[:, None] * u[None, :]
        o = tl.sum(state * (scale * q)[:, None], axis=0)
        if ZERO_PADDING_OUTPUT:
            o = tl.where(live, o, 0.0)
        tl.store(out_ptr + n * stride_on + h * stride_oh + vs, o.to(out_ptr.dtype.element_ty), mask=v_ok)
    tl.store(slab, state, mask=slab_ok)


def _launch(q, k, v, g, beta, state_pool, state_ids, cu_seqlens, scale, use_qk_l2norm, block_v, num_warps,
            decode):
    heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    sequences = state_ids.shape[0]
    if out.numel() == 0 or sequences == 0:
        return out.zero_()
    if state_pool.stride(-1) != 1:
        raise ValueError("triton kda: state_pool needs unit stride in V")
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    grid = (triton.cdiv(value_dim, block_v), sequences * heads)
    kda_recurrent_kernel[grid](
        q, k, v, g, beta,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1),
        out, out.stride(0), out.stride(1),
        state_pool, state_pool.stride(0), state_pool.stride(1), state_pool.stride(2),
        state_ids, cu_seqlens if cu_seqlens is not None else state_ids,
        heads, key_dim, value_dim, state_pool.shape[0], float(scale),
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, VARLEN=not decode, L2NORM=bool(use_qk_l2norm),
        ZERO_PADDING_OUTPUT=decode, num_warps=num_warps,
    )
    return out


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, *, block_v=32, num_warps=4):
    """One step for ``B`` requests: q, k, g ``[B, H, K]``, v ``[B, H, V]``, beta ``[B, H]``,
    state_pool ``[P, H, K, V]`` fp32 updated in place at ``state_ids [B]``. Returns ``[B, H, V]``."""
    return _launch(q, k, v, g, beta, state_pool, state_ids, None, scale, use_qk_l2norm, block_v, num_warps, True)


def kda_prefill_recurrent(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, *,
                          block_v=32, num_warps=4):
    """Token-by-token prefill of packed sequences (``cu_seqlens [B + 1]``): exact, batch invariant,
    and independent of fla; slower than a chunked kernel on long sequences."""
    return _launch(q, k, v, g, beta, state_pool, state_ids, cu_seqlens, scale, use_qk_l2norm, block_v,
                   num_warps, False)
