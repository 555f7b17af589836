"""KDA prefill through flash-linear-attention's chunked kernel (``fla.ops.kda.chunk_kda``).

The pool states of the batch's requests are gathered as fla's ``initial_state`` ``[N, H, K, V]``
and its final states scattered back; padding requests (id -1) start from zero and write nothing.
Empty sequences are dropped before the call (their state is unchanged by definition).
"""
from __future__ import annotations

import torch


def kda_prefill_fla(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """q, k, g ``[T, H, K]``; v ``[T, H, V]``; beta ``[T, H]``; cu_seqlens ``[B + 1]``;
    state_pool ``[P, H, K, V]`` fp32 (updated in place); state_ids ``[B]``. Returns ``[T, H, V]`` in q's dtype."""
    from fla.ops.kda import chunk_kda

    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    keep = lengths > 0
    if not bool(keep.any()):
        return out
    ids = state_ids[keep].long()
    live = (ids >= 0) & (ids < state_pool.shape[0])
    initial = torch.where(live[:, None, None, None], state_pool[ids.clamp(0, state_pool.shape[0] - 1)],
                          torch.zeros((), dtype=state_pool.dtype, device=state_pool.device))
    cu = torch.cat([cu_seqlens[:1].long(), cu_seqlens[1:].long()[keep]])
    dtype = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32
    o, final = chunk_kda(
        q.to(dtype)[None], k.to(dtype)[None], v.to(dtype)[None], g.float()[None], beta.to(dtype)[None],
        scale=scale, initial_state=initial.contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm), cu_seqlens=cu,
    )
    out.copy_(o[0].to(q.dtype))
    if bool(live.any()):
        state_pool[ids[live]] = final[live].to(state_pool.dtype)
    return out
