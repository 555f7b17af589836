"""KDA (Kimi Delta Attention): gated delta-rule linear attention with a per-request state.

Per head, with state ``S`` ``[K, V]`` fp32, channel-wise log-decay ``g_t`` ``[K]`` and scalar ``β_t``::

    S   <- S ⊙ exp(g_t)[:, None]
    u   <- β_t · (v_t − Sᵀ k_t)
    S   <- S + k_t uᵀ
    o_t <- Sᵀ (scale · q_t)          # read after the write

q and k are optionally L2-normalised first (``x / sqrt(Σx² + 1e-6)``); scale defaults to K^-0.5.
States live in a pool ``[P, H, K, V]`` fp32 (possibly a strided view into the packed cache),
addressed per request by ``state_ids``; id -1 is a padding request: zero output, no state write.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..registry.state import active_table
from ._dispatch import tracing
from ._layout import unit_last
from ._validate import (ANY_FLOAT_DTYPES, FLOAT_DTYPES, INDEX_DTYPES, INT32_MAX, ShapeBinder, can_read_values,
                        values_in_range)

L2NORM_EPS = 1e-6


@torch.library.custom_op("dsahal::kda_decode", mutates_args=("state_pool",))
def _kda_decode_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state_pool: torch.Tensor, state_ids: torch.Tensor, scale: float, use_qk_l2norm: bool,
) -> torch.Tensor:
    return active_table().dispatch["kda_decode"](q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm)


@_kda_decode_op.register_fake
def _(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return v.new_empty(v.shape, dtype=q.dtype)


@torch.library.custom_op("dsahal::kda_prefill", mutates_args=("state_pool",))
def _kda_prefill_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_ids: torch.Tensor, scale: float,
    use_qk_l2norm: bool,
) -> torch.Tensor:
    return active_table().dispatch["kda_prefill"](q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale,
                               use_qk_l2norm)


@_kda_prefill_op.register_fake
def _(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    return v.new_empty(v.shape, dtype=q.dtype)


def _validate_common(v: ShapeBinder, q, k, val, g, beta, state_pool, state_ids, scale, use_qk_l2norm,
                     lead: str) -> None:
    v.tensor("q", q, [lead, "H", "K"], FLOAT_DTYPES, last_dim_contiguous=True)
    v.tensor("k", k, [lead, "H", "K"], FLOAT_DTYPES, last_dim_contiguous=True)
    v.tensor("v", val, [lead, "H", "V"], FLOAT_DTYPES, last_dim_contiguous=True)
    v.tensor("g", g, [lead, "H", "K"], ANY_FLOAT_DTYPES)  # documented: any float dtype, used in fp32
    v.tensor("beta", beta, [lead, "H"], FLOAT_DTYPES)
    v.tensor("state_pool", state_pool, [None, "H", "K", "V"], torch.float32)
    # Updated in place: two ids whose rows alias would read each other's writes.
    v.disjoint("state_pool", state_pool, "states (or two elements of one)")
    v.writable("state_pool", state_pool)
    v.at_most("state_pool", state_pool.shape[0], INT32_MAX + 1, "a pool size (state ids are int32)")
    v.tensor("state_ids", state_ids, ["B"], INDEX_DTYPES)
    # The caller's own scale, checked before any float(): a tensor, bool or string is a wrong call, not 0.1.
    if scale is not None:
        v.positive_float("scale", scale)
    elif v.sizes["K"] == 0:
        v.fail("argument 'q' expected a key dim K >= 1 (the default scale is K^-0.5), got K=0 with scale=None")
    v.flag("use_qk_l2norm", use_qk_l2norm)
    v.same_device(q=q, k=k, v=val, g=g, beta=beta, state_pool=state_pool, state_ids=state_ids)
    v.has_data("q", q)  # state_ids and cu_seqlens are read to update the pool
    values_in_range(v.op, "state_ids", state_ids, -1, state_pool.shape[0] - 1, what=" (-1: padding request)")
    if can_read_values(state_ids):
        used = state_ids[state_ids >= 0]
        if used.numel() != torch.unique(used).numel():
            v.fail("argument 'state_ids' expected distinct ids (except -1), got a state used twice")


def validate_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm) -> None:
    binder = ShapeBinder("kda_decode")
    _validate_common(binder, q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, "B")


def validate_kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm) -> None:
    binder = ShapeBinder("kda_prefill")
    _validate_common(binder, q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, "T")
    binder.tensor("cu_seqlens", cu_seqlens, [binder.sizes["B"] + 1], INDEX_DTYPES)
    binder.same_device(q=q, cu_seqlens=cu_seqlens)  # (q's device is every other tensor's: checked above)
    if can_read_values(cu_seqlens):
        steps = cu_seqlens[1:] - cu_seqlens[:-1]
        if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != binder.sizes["T"] or bool((steps < 0).any()):
            binder.fail(f"argument 'cu_seqlens' expected non-decreasing offsets from 0 to T={binder.sizes['T']}, "
                        f"got {cu_seqlens.tolist()}")


def _default_scale(q: torch.Tensor, scale: Optional[float]) -> float:
    """``K^-0.5`` for ``scale=None``; called after validation, which sees the caller's own ``scale`` (a
    ``float()`` first would let a tensor, bool or string through and fail on a non-tensor ``q``)."""
    return float(q.shape[-1]) ** -0.5 if scale is None else float(scale)


def kda_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state_pool: torch.Tensor, state_ids: torch.Tensor, *, scale: Optional[float] = None,
    use_qk_l2norm: bool = True, check: bool = True,
) -> torch.Tensor:
    """One recurrent step for a batch of requests, updating their pooled states in place.

    Args:
        q, k: ``[B, H, K]`` fp32/bf16/fp16.
        v: ``[B, H, V]``.
        g: ``[B, H, K]`` log-space decay (≤ 0 for a decay; any float dtype: fp32/bf16/fp16/fp64, used in fp32).
        beta: ``[B, H]`` write strength (already through its sigmoid).
        state_pool: ``[P, H, K, V]`` fp32, updated in place at ``state_ids``; may be a strided view (the
            packed cache's rows), but no two states may share memory.
        state_ids: ``[B]`` int32 distinct pool rows; -1 for padding requests.
        scale: query scale, a finite float > 0 (a tensor or bool is a TypeError); default ``K^-0.5``.
        use_qk_l2norm: L2-normalise q and k first (a bool: ``"no"`` is a TypeError, not true).

    Returns:
        ``[B, H, V]`` in q's dtype (zeros for padding requests).
    """
    if check:
        validate_kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm)
    scale = _default_scale(q, scale)
    state_ids = unit_last(state_ids)
    if tracing():
        return torch.ops.dsahal.kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, bool(use_qk_l2norm))
    return active_table().dispatch["kda_decode"](q, k, v, g, beta, state_pool, state_ids, scale, bool(use_qk_l2norm))


def kda_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_ids: torch.Tensor, *,
    scale: Optional[float] = None, use_qk_l2norm: bool = True, check: bool = True,
) -> torch.Tensor:
    """Chunked prefill over variable-length sequences packed along T.

    Sequence ``b`` is tokens ``cu_seqlens[b]:cu_seqlens[b+1]``; it starts from
    ``state_pool[state_ids[b]]`` and writes its final state back there (id -1: start from zero,
    write nothing). Equal to running :func:`kda_decode` token by token.

    Args:
        q, k: ``[T, H, K]``; v: ``[T, H, V]``; g: ``[T, H, K]`` (any float dtype); beta: ``[T, H]``.
        cu_seqlens: ``[B + 1]`` int32 offsets, 0 first and T last, non-decreasing.
        state_pool: ``[P, H, K, V]`` fp32; state_ids: ``[B]`` int32.

    Returns:
        ``[T, H, V]`` in q's dtype.
    """
    if check:
        validate_kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)
    scale = _default_scale(q, scale)
    cu_seqlens, state_ids = unit_last(cu_seqlens), unit_last(state_ids)
    if tracing():
        return torch.ops.dsahal.kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale,
                                        bool(use_qk_l2norm))
    return active_table().dispatch["kda_prefill"](q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale,
                                        bool(use_qk_l2norm))
