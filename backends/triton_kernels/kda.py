"""KDA recurrent step over a pooled per-request state (decode, and token-by-token prefill).

Per head, state ``S [K, V]`` fp32::

    S <- S ⊙ exp(g_t)[:, None];  u = β_t (v_t − Sᵀ k_t);  S <- S + k_t uᵀ;  o_t = Sᵀ (scale q_t)

One program owns the ``[K, BLOCK_V]`` column slab of one (sequence, head) state: it reads the
slab once, runs every token of its sequence, writes it back once. Decode is the case of one
token per sequence; it is memory-bound on the state (read + write 2 · K · V · 4 bytes per head),
so the slab is sized to keep enough bytes in flight. State id -1 (or out of range) means a
padding request: decode writes a zero output and no state; prefill starts from zero and writes
no state.

Decode variants (launcher arguments, all off by default; the default kernel is unchanged):

* ``scalar_row``: the state id is one scalar per program, the slab address one scalar base plus
  64-bit row offsets of a constant K stride (they fold into the load / store immediates), a
  padding request a branch (zero output, no state access) rather than a mask on every element,
  and no bounds masks when ``K == BLOCK_K`` and ``BLOCK_V`` divides ``V``. The default broadcasts
  the id to the V lanes and adds 32-bit offsets, so every row of the slab has its own 64-bit
  address held from the load to the store (sm_90, 64 columns x 4 warps: 151 registers, 3
  programs per SM; this path: 117, 4 programs, a third more state bytes in flight).
* ``fused_output``: ``o = (S ⊙ e^g)ᵀ q̃ + u (k · q̃)`` (q̃ = scale q): the two K reductions read
  the decayed state together, in one reduction, instead of the second waiting for the update.
* ``stream_state``: the state is read and written with streaming cache hints (evict first): it is
  touched once per call, so it should not push other data out of L2.
* ``maxnreg``: a register cap per thread passed to the compiler (None: the compiler's choice).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid
from .alignment import aligned_rows
from .limits import kda_gate
from dsahal.kernel_launch import wrap_launched


# The arguments whose alignment facts are the same whichever rows a batch holds (compile_budget: batch-invariant mode
# keeps them): the state pool (the cache) and its K and V; and those the launchers align on every call (the token
# tensors, :func:`~.alignment.aligned_rows`). With neither, the sm_90 compiles of batch-invariant mode were the fully
# generic twin's: the decode step 223 registers against 127, the token-by-token prefill 255 and a 312-byte spill
# against 218 and none (thirty-first session, ``python -m dsahal.backends.nvidia.aot --invariant``); with them the
# same SASS as the default compiles.
# (beta's head stride is its unit last-dim stride once aligned: 1 on every call, a fact kept with the cache's)
_TOKEN_ARGS = ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr", "stride_qn", "stride_qh", "stride_kn", "stride_kh",
               "stride_vn", "stride_vh", "stride_gn", "stride_gh", "stride_bn")
CACHE_ARGS = {"kda_recurrent_kernel": ("state_ptr", "stride_sp", "stride_sh", "stride_sk", "K", "V", "stride_bh"),
              "kda_decode_step_kernel": ("state_ptr", "stride_sp", "stride_sh", "K", "V", "stride_bh")}
LAUNCHER_ALIGNED_ARGS = {"kda_recurrent_kernel": _TOKEN_ARGS, "kda_decode_step_kernel": _TOKEN_ARGS}


@triton.jit
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _token_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, stride_qn, stride_qh, stride_kn, stride_kh, stride_vn,
                  stride_vh, stride_gn, stride_gh, stride_bn, stride_bh, n, h, ks, vs, k_ok, v_ok,
                  L2NORM: tl.constexpr):
    """Token ``n``'s head ``h`` in fp32: ``(q [BLOCK_K], k [BLOCK_K], g [BLOCK_K], v [BLOCK_V], beta [])``,
    q and k L2-normalised when ``L2NORM`` (shared by both kernels: the same loads, the same math)."""
    q = tl.load(q_ptr + n * stride_qn + h * stride_qh + ks, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + n * stride_kn + h * stride_kh + ks, mask=k_ok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + n * stride_gn + h * stride_gh + ks, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + n * stride_vn + h * stride_vh + vs, mask=v_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + n * stride_bn + h * stride_bh).to(tl.float32)
    if L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    return q, k, g, v, beta


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
    # h as int64 (as the one-step kernel): a strided pool's head stride can be large (a heads-major cache of 8192
    # states of 128 x 128: 2^27 elements, head 16 at 2^31), and h * stride_sh then wraps in int32
    slab = state_ptr + tl.where(live, sid, 0)[None, :] * stride_sp + h.to(tl.int64) * stride_sh \
        + ks[:, None] * stride_sk \
        + vs[None, :]
    state = tl.load(slab, mask=slab_ok, other=0.0)

    if VARLEN:
        start = tl.load(cu_ptr + seq).to(tl.int64)
        end = tl.load(cu_ptr + seq + 1).to(tl.int64)
    else:
        start = seq.to(tl.int64)
        end = start + 1
    for n in range(start, end):
        q, k, g, v, beta = _token_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, stride_qn, stride_qh, stride_kn,
                                         stride_kh, stride_vn, stride_vh, stride_gn, stride_gh, stride_bn,
                                         stride_bh, n, h, ks, vs, k_ok, v_ok, L2NORM)
        state = state * tl.exp(g)[:, None]
        u = beta * (v - tl.sum(state * k[:, None], axis=0))
        state = state + k[:, None] * u[None, :]
        o = tl.sum(state * (scale * q)[:, None], axis=0)
        if ZERO_PADDING_OUTPUT:
            o = tl.where(live, o, 0.0)
        tl.store(out_ptr + n * stride_on + h * stride_oh + vs, o.to(out_ptr.dtype.element_ty), mask=v_ok)
    tl.store(slab, state, mask=slab_ok)


@triton.jit
def kda_decode_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # q, k, g [B, H, K]; v [B, H, V]; beta [B, H]
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_gn, stride_gh, stride_bn, stride_bh,
    out_ptr, stride_on, stride_oh,  # [B, H, V]
    state_ptr, stride_sp, stride_sh,  # state pool [P, H, K, V] fp32 (unit stride in V, STRIDE_K in K)
    ids_ptr,  # [B] state ids
    H, K, V, P, scale,
    STRIDE_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, L2NORM: tl.constexpr, EVEN: tl.constexpr,
    FUSED_OUTPUT: tl.constexpr, STREAM: tl.constexpr,
):
    """Decode with one scalar state row per program (``scalar_row``): grid ``(cdiv(V, BLOCK_V), B * H)``.
    ``EVEN``: K == BLOCK_K and BLOCK_V divides V (no bounds masks). ``STRIDE_K`` (the pool's K stride, V
    in a dense pool) is a constant so that the slab's row offsets are immediates of one base address,
    not 64-bit addresses per row held from the load to the store."""
    pid_v = tl.program_id(0)
    seq = tl.program_id(1) // H
    h = tl.program_id(1) % H
    ks = tl.arange(0, BLOCK_K)
    vs = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ks < K
    v_ok = vs < V
    out_row = out_ptr + seq.to(tl.int64) * stride_on + h * stride_oh + vs
    sid = tl.load(ids_ptr + seq).to(tl.int64)
    if (sid >= 0) & (sid < P):
        # one scalar base; 64-bit offsets: base + (row * STRIDE_K + col) then folds into immediates of a
        # single address (32-bit offsets could wrap, so the compiler kept one 64-bit address per row)
        base = state_ptr + sid * stride_sp + h.to(tl.int64) * stride_sh
        slab = base + (ks.to(tl.int64)[:, None] * STRIDE_K + vs.to(tl.int64)[None, :])
        if EVEN:
            if STREAM:
                state = tl.load(slab, eviction_policy="evict_first")
            else:
                state = tl.load(slab)
        else:
            slab_ok = k_ok[:, None] & v_ok[None, :]
            if STREAM:
                state = tl.load(slab, mask=slab_ok, other=0.0, eviction_policy="evict_first")
            else:
                state = tl.load(slab, mask=slab_ok, other=0.0)
        q, k, g, v, beta = _token_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, stride_qn, stride_qh, stride_kn,
                                         stride_kh, stride_vn, stride_vh, stride_gn, stride_gh, stride_bn,
                                         stride_bh, seq.to(tl.int64), h, ks, vs, k_ok, v_ok, L2NORM)
        q = scale * q
        state = state * tl.exp(g)[:, None]
        if FUSED_OUTPUT:
            # o = (S + k uᵀ)ᵀ q = Sᵀ q + u (k · q): both reductions read the decayed state, in one pass
            sk, sq = tl.reduce((state * k[:, None], state * q[:, None]), 0, _add_pair)
            u = beta * (v - sk)
            o = sq + u * tl.sum(k * q, axis=0)
            state = state + k[:, None] * u[None, :]
        else:
            u = beta * (v - tl.sum(state * k[:, None], axis=0))
            state = state + k[:, None] * u[None, :]
            o = tl.sum(state * q[:, None], axis=0)
        tl.store(out_row, o.to(out_ptr.dtype.element_ty), mask=v_ok)
        if EVEN:
            if STREAM:
                tl.store(slab, state, eviction_policy="evict_first")
            else:
                tl.store(slab, state)
        else:
            if STREAM:
                tl.store(slab, state, mask=k_ok[:, None] & v_ok[None, :], eviction_policy="evict_first")
            else:
                tl.store(slab, state, mask=k_ok[:, None] & v_ok[None, :])
    else:  # a padding request: zero output, no state read or written
        tl.store(out_row, tl.zeros([BLOCK_V], dtype=tl.float32).to(out_ptr.dtype.element_ty), mask=v_ok)


def sequence_ranges(sequences: int, heads: int, cap: int | None = None):
    """``(first, last)`` ranges of sequences whose ``(last - first) · heads`` programs fit grid axis 1 (``cap``,
    default :data:`.grid.MAX_GRID_YZ`, read at call time): one range, ``(0, sequences)``, unless the call is
    that large (2,048 requests of 32 heads would be 65,536)."""
    cap = grid.MAX_GRID_YZ if cap is None else cap
    step = max(1, cap // max(1, heads))
    if sequences <= step:
        return [(0, sequences)] if sequences else []
    return grid.ranges(sequences, step)


_ALL = None  # _rows: the tensors as given (no view made: a launch that fits costs what it did)


def _rows(rows, *tensors):
    """``tensors`` sliced to ``rows`` (a slice of the leading dim), or as given for :data:`_ALL`."""
    return tensors if rows is _ALL else tuple(t[rows] for t in tensors)


def _check_state_pool(state_pool):
    if state_pool.stride(-1) != 1:
        raise ValueError("triton kda: state_pool needs unit stride in V")


def _launch(q, k, v, g, beta, state_pool, state_ids, cu_seqlens, scale, use_qk_l2norm, block_v, num_warps,
            decode):
    q, k, v, g, beta = (aligned_rows(t) for t in (q, k, v, kda_gate(g), beta))  # (LAUNCHER_ALIGNED_ARGS)
    heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    sequences = state_ids.shape[0]
    if out.numel() == 0 or sequences == 0:
        return out.zero_()
    _check_state_pool(state_pool)
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    for first, last in sequence_ranges(sequences, heads):  # one range unless B x H passes grid axis 1's cap
        whole = last - first == sequences
        # a decode step's tokens are its sequences: those rows are sliced; a prefill's cu_seqlens slice keeps
        # the absolute token offsets, so its token tensors stay whole
        rows = _ALL if whole or not decode else slice(first, last)
        ids = state_ids if whole else state_ids[first:last]
        bounds = ids if cu_seqlens is None else cu_seqlens if whole else cu_seqlens[first:last + 1]
        programs = (triton.cdiv(value_dim, block_v), (last - first) * heads)
        kda_recurrent_kernel[programs](
            *_rows(rows, q, k, v, g, beta),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1),
            *_rows(rows, out), out.stride(0), out.stride(1),
            state_pool, state_pool.stride(0), state_pool.stride(1), state_pool.stride(2),
            ids, bounds,
            heads, key_dim, value_dim, state_pool.shape[0], float(scale),
            BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, VARLEN=not decode, L2NORM=bool(use_qk_l2norm),
            ZERO_PADDING_OUTPUT=decode, num_warps=num_warps,
        )
    return out


def _launch_scalar_row(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, block_v, num_warps,
                       num_stages, fused_output, stream_state, maxnreg):
    q, k, v, g, beta = (aligned_rows(t) for t in (q, k, v, kda_gate(g), beta))  # (LAUNCHER_ALIGNED_ARGS)
    heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    sequences = state_ids.shape[0]
    if out.numel() == 0 or sequences == 0:
        return out.zero_()
    _check_state_pool(state_pool)
    block_k = triton.next_power_of_2(key_dim)
    block_v = min(block_v, triton.next_power_of_2(value_dim))
    extra = {} if maxnreg is None else dict(maxnreg=int(maxnreg))
    for first, last in sequence_ranges(sequences, heads):  # one range unless B x H passes grid axis 1's cap
        rows = _ALL if last - first == sequences else slice(first, last)
        programs = (triton.cdiv(value_dim, block_v), (last - first) * heads)
        kda_decode_step_kernel[programs](
            *_rows(rows, q, k, v, g, beta),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1),
            *_rows(rows, out), out.stride(0), out.stride(1),
            state_pool, state_pool.stride(0), state_pool.stride(1),
            *_rows(rows, state_ids), heads, key_dim, value_dim, state_pool.shape[0], float(scale),
            STRIDE_K=state_pool.stride(2), BLOCK_K=block_k, BLOCK_V=block_v, L2NORM=bool(use_qk_l2norm),
            EVEN=block_k == key_dim and value_dim % block_v == 0, FUSED_OUTPUT=bool(fused_output),
            STREAM=bool(stream_state), num_warps=num_warps, num_stages=num_stages, **extra,
        )
    return out


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, *, block_v=32, num_warps=4,
               num_stages=None, scalar_row=False, fused_output=False, stream_state=False, maxnreg=None):
    """One step for ``B`` requests: q, k, g ``[B, H, K]``, v ``[B, H, V]``, beta ``[B, H]``,
    state_pool ``[P, H, K, V]`` fp32 updated in place at ``state_ids [B]``. Returns ``[B, H, V]``.

    The defaults launch ``kda_recurrent_kernel`` exactly as before. ``scalar_row`` (and the options
    that need it: ``fused_output``, ``stream_state``, ``maxnreg``, ``num_stages``) launches
    ``kda_decode_step_kernel``; see the module docstring."""
    if not scalar_row:
        wanted = {name: value for name, value in (("fused_output", fused_output), ("stream_state", stream_state),
                                                  ("maxnreg", maxnreg), ("num_stages", num_stages))
                  if value is not None and value is not False}
        if wanted:
            raise ValueError(f"triton kda_decode: {', '.join(sorted(wanted))} need scalar_row=True, "
                             f"got scalar_row=False with {wanted}")
        return _launch(q, k, v, g, beta, state_pool, state_ids, None, scale, use_qk_l2norm, block_v, num_warps,
                       True)
    return _launch_scalar_row(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, block_v, num_warps,
                              3 if num_stages is None else num_stages, fused_output, stream_state, maxnreg)


def kda_prefill_recurrent(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, *,
                          block_v=32, num_warps=4):
    """Token-by-token prefill of packed sequences (``cu_seqlens [B + 1]``): exact, batch invariant,
    and independent of fla; slower than a chunked kernel on long sequences."""
    return _launch(q, k, v, g, beta, state_pool, state_ids, cu_seqlens, scale, use_qk_l2norm, block_v,
                   num_warps, False)


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
