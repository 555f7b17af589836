"""KDA on XLA: a batched recurrent decode step, and a chunked prefill scanned over chunks.

Prefill uses the chunked matmul form of :mod:`dsahal.reference.kda` (read its docstring for the
algebra), reorganised for static shapes:

1. **Chunk-aligned layout.** Sequences are packed along T with data-dependent lengths, so each
   sequence is laid out on whole chunks of ``CHUNK_SIZE`` tokens in a padded buffer of
   ``ceil(T / C) + B`` chunks, a static upper bound. Addresses come from ``cu_seqlens`` by
   tensor arithmetic (no host read); padding tokens are zeros, which leave the state unchanged
   (``g = 0``: no decay, ``β = 0``: no write).
2. **Parallel part, all chunks at once.** With ``M = I + A`` (unit lower triangular), the
   chunk's pseudo-values split into a state-free and a state-linear part,
   ``U = M⁻¹ diag(β) V − M⁻¹ diag(β) (K ⊙ e^G) S₀ = U_v − W S₀``, both from one batched
   triangular solve (XLA's TriangularSolve), together with the masked ``q·k`` decay products.
3. **Sequential part, a scan.** ``torch_xla.experimental.scan`` (an XLA While loop, one
   compiled body) carries the state across chunks: ``S₀`` is reset to the sequence's pool state
   on its first chunk, ``U = U_v − W S₀``, ``o = scale (Q_e S₀ + QK U)``,
   ``S ← e^{G_C} ⊙ S₀ + K_dᵀ U``; only matmuls remain in the loop.

The final state of each sequence is the state after its last chunk, written back to the pool
by a scatter that skips ids -1 and empty sequences.
"""
from __future__ import annotations

import contextlib

import torch
from torch_xla.experimental.scan import scan

from dsahal.ops.kda import L2NORM_EPS

from .paged import scatter_rows_skipping

CHUNK_SIZE = 64
# exp(-110) is 0.0 in fp32 (its smallest subnormal is ~e^-103): the same full reset of a channel as a -inf gate
# (a decode step's exp(-inf) = 0), but finite, so the pairwise decay differences never meet -inf - (-inf) = NaN
RESET_GATE = -110.0


def _l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _prepare(q, k, use_qk_l2norm):
    q, k = q.to(torch.float32), k.to(torch.float32)
    if use_qk_l2norm:
        q, k = _l2_normalise(q), _l2_normalise(k)
    return q, k


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    """One step for ``B`` requests: q, k, g ``[B, H, K]``, v ``[B, H, V]``, beta ``[B, H]``; the
    pooled states ``state_pool[state_ids]`` ``[B, H, K, V]`` are read, stepped and written back."""
    if state_ids.shape[0] == 0:
        return v.new_zeros(v.shape, dtype=q.dtype)
    live = state_ids >= 0
    ids = torch.where(live, state_ids, torch.zeros_like(state_ids)).to(torch.int64)
    qf, kf = _prepare(q, k, use_qk_l2norm)
    state = state_pool[ids] * torch.exp(g.to(torch.float32))[..., None]
    u = beta.to(torch.float32)[..., None] * (v.to(torch.float32) - torch.einsum("bhkv,bhk->bhv", state, kf))
    state = state + kf[..., :, None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", state, scale * qf)
    o = torch.where(live[:, None, None], o, torch.zeros_like(o))
    scatter_rows_skipping(state_pool, (ids,), state, live)
    return o.to(q.dtype)


def chunk_layout(cu_seqlens: torch.Tensor, tokens: int, chunk: int):
    """Where every token goes in the chunk-aligned buffer.

    Returns (all tensors, no host reads):
        source ``[NC, C]`` int64 token feeding each padded position (0 where padding),
        filled ``[NC, C]`` bool, token_slot ``[T]`` int64 padded position of each token,
        chunk_seq ``[NC]`` int64 sequence of each chunk (B = unused), first ``[NC]`` bool
        (first chunk of its sequence), last_chunk ``[B]`` int64, has_tokens ``[B]`` bool.
    """
    cu = cu_seqlens.to(torch.int64)
    batch = cu.shape[0] - 1
    lengths = cu[1:] - cu[:-1]
    chunks_per_seq = torch.div(lengths + chunk - 1, chunk, rounding_mode="floor")
    chunk_end = torch.cumsum(chunks_per_seq, dim=0)
    chunk_start = chunk_end - chunks_per_seq
    num_chunks = -(-tokens // chunk) + batch  # static bound on sum(ceil(len_b / C))
    chunk_ids = torch.arange(num_chunks, device=cu.device)
    chunk_seq = (chunk_end[None, :] <= chunk_ids[:, None]).sum(dim=1)  # [NC]
    used = chunk_seq < batch
    seq = chunk_seq.clamp(max=batch - 1)
    first = used & (chunk_ids == chunk_start[seq])
    offset = (chunk_ids - chunk_start[seq])[:, None] * chunk + torch.arange(chunk, device=cu.device)[None, :]
    filled = used[:, None] & (offset < lengths[seq][:, None])
    source = torch.where(filled, cu[seq][:, None] + offset, torch.zeros_like(offset))
    token_ids = torch.arange(tokens, device=cu.device)
    token_seq = (cu[1:][None, :] <= token_ids[:, None]).sum(dim=1).clamp(max=batch - 1)
    token_slot = chunk_start[token_seq] * chunk + (token_ids - cu[token_seq])
    return source, filled, token_slot, chunk_seq, first, (chunk_end - 1).clamp_min(0), chunks_per_seq > 0


def _to_chunks(x: torch.Tensor, source: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """``[T, H, ...]`` -> ``[NC, H, C, ...]`` (heads before the chunk axis), zeros where unfilled."""
    gathered = x[source]  # [NC, C, H, ...]
    mask = filled.reshape(*filled.shape, *([1] * (x.dim() - 1)))
    gathered = torch.where(mask, gathered, torch.zeros_like(gathered))
    return gathered.transpose(1, 2)


def chunk_terms(q, k, v, g, beta):
    """The state-independent terms of every chunk, all chunks at once.

    q, k, g ``[N, H, C, K]``; v ``[N, H, C, V]``; beta ``[N, H, C]`` (fp32). Returns
    ``U_v`` ``[N, H, C, V]``, ``W`` ``[N, H, C, K]``, ``Q_e`` ``[N, H, C, K]``, ``QK`` ``[N, H, C, C]``,
    ``K_d`` ``[N, H, C, K]``, ``decay`` ``[N, H, K]`` (``e^{G_C}``)."""
    chunk = q.shape[2]
    cum = torch.cumsum(g.clamp_min(RESET_GATE), dim=2)
    # e^{G_i - G_j} formed pairwise (<= 0 exponents on the kept j <= i), never as e^{-G}.
    pair = torch.exp((cum[:, :, :, None, :] - cum[:, :, None, :, :]).clamp_max(0.0))  # [N, H, C, C, K]
    strictly_lower = torch.tril(torch.ones(chunk, chunk, device=q.device), diagonal=-1)
    lower = torch.tril(torch.ones(chunk, chunk, device=q.device))
    a = beta[..., None] * torch.einsum("nhic,nhjc,nhijc->nhij", k, k, pair) * strictly_lower
    qk = torch.einsum("nhic,nhjc,nhijc->nhij", q, k, pair) * lower
    decayed_keys = k * torch.exp(cum)
    rhs = beta[..., None] * torch.cat([v, decayed_keys], dim=-1)
    eye = torch.eye(chunk, device=q.device)
    solved = torch.triangular_solve(rhs, eye + a, upper=False, unitriangular=True).solution
    value_dim = v.shape[-1]
    last = cum[:, :, -1:, :]
    return (solved[..., :value_dim], solved[..., value_dim:], q * torch.exp(cum), qk,
            k * torch.exp(last - cum), torch.exp(last[:, :, 0, :]))


@contextlib.contextmanager
def _autograd_tracing():
    """Grad mode with the autograd dispatch keys re-enabled.

    ``scan`` traces its body with AOTAutograd (forward and backward graphs), which records
    nothing when, as inside a custom op's body, the dispatcher has excluded the autograd and
    ADInplaceOrView keys. Nothing here requires a gradient; the keys are needed for tracing only."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality,
                torch._C.DispatchKey.AutogradOther, torch._C.DispatchKey.AutogradXLA):
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


def _chunk_step(scale):
    def step(state, chunk):
        u_v, w, q_e, qk, k_d, decay, first, initial = chunk
        start = torch.where(first, initial, state)  # a sequence's first chunk starts from its pool state
        u = u_v - w @ start
        o = scale * (q_e @ start + qk @ u)
        state = decay[..., None] * start + k_d.transpose(-1, -2) @ u
        return state, (o, state)
    return step


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """Chunked prefill: q, k, g ``[T, H, K]``, v ``[T, H, V]``, beta ``[T, H]``, cu_seqlens ``[B + 1]``;
    returns ``[T, H, V]`` in q's dtype and writes each sequence's final state to the pool."""
    tokens, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if tokens == 0:
        return v.new_zeros(v.shape, dtype=q.dtype)
    source, filled, token_slot, chunk_seq, first, last_chunk, has_tokens = chunk_layout(
        cu_seqlens, tokens, CHUNK_SIZE)
    qf, kf = _prepare(q, k, use_qk_l2norm)
    parts = [_to_chunks(x, source, filled) for x in (qf, kf, v.to(torch.float32), g.to(torch.float32),
                                                      beta.to(torch.float32))]
    terms = chunk_terms(*parts)
    live = state_ids >= 0
    ids = torch.where(live, state_ids, torch.zeros_like(state_ids)).to(torch.int64)
    initial = torch.where(live[:, None, None, None], state_pool[ids], torch.zeros_like(state_pool[ids]))
    batch = state_ids.shape[0]
    chunk_initial = initial[chunk_seq.clamp(max=batch - 1)]  # [NC, H, K, V]
    zero_state = q.new_zeros((heads, key_dim, value_dim), dtype=torch.float32)
    with _autograd_tracing():
        _, (outputs, states) = scan(_chunk_step(scale), zero_state, (*terms, first, chunk_initial))
    padded = outputs.transpose(1, 2).reshape(-1, heads, value_dim)  # [NC * C, H, V]
    o = padded[token_slot]
    scatter_rows_skipping(state_pool, (ids,), states[last_chunk], live & has_tokens)
    return o.to(q.dtype)
