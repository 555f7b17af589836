"""KDA prefill through flash-linear-attention's chunked kernel (``fla.ops.kda.chunk_kda``).

The pool states of the batch's requests are gathered as fla's ``initial_state`` ``[N, H, K, V]``
and its final states scattered back; padding requests (id -1) start from zero and write nothing.
Empty sequences are dropped before the call (their state is unchanged by definition).
"""
from __future__ import annotations

import importlib.util

import torch

from dsahal.backends.triton_kernels import limits

from . import config
from .fla_setup import import_chunk_kda
from .fla_setup import status as fla_status


def probe() -> tuple[bool, str]:
    if importlib.util.find_spec("fla") is None:
        return False, "fla-core is not installed (pip install fla-core)"
    try:
        import_chunk_kda()
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here"
        return False, f"fla.ops.kda does not import: {type(exc).__name__}: {exc}"
    from importlib.metadata import version

    return True, f"fla-core {version('fla-core')} chunk_kda; {fla_status()}"


def accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm) -> tuple[bool, str]:
    """fla's chunk kernel serves bf16/fp16 inputs outside batch-invariant mode: it picks its tiles by the
    batch's total length, and runs its dots at tf32/bf16 precision (2.3e-3 relative error on fp32 inputs,
    where the conformance suite allows fp32's 9.8e-4; H200, 2026-11-29), so fp32 inputs stay on the
    exact recurrent kernel."""
    if config.batch_invariant():
        return False, "batch-invariant mode: fla's chunk tiles depend on the batch's total length"
    if q.dtype == torch.float32:
        return False, "fp32 inputs: fla's chunk kernel computes at tf32/bf16 precision"
    return limits.kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)


def kda_prefill_fla(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """q, k, g ``[T, H, K]``; v ``[T, H, V]``; beta ``[T, H]``; cu_seqlens ``[B + 1]``;
    state_pool ``[P, H, K, V]`` fp32 (updated in place); state_ids ``[B]``. Returns ``[T, H, V]`` in q's dtype."""
    chunk_kda = import_chunk_kda()
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
