"""Sparse MLA: absorbed multi-head latent attention over each query's selected cache slots."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..formats import LATENT_DIM, LATENT_FORMATS, LATENT_NOPE_DIM, latent_format
from ..registry.state import active_table
from ._dispatch import tracing
from ._empty import attention_without_keys, holds_no_record
from ._layout import unit_last
from ._validate import INDEX_DTYPES, INT32_MAX, ShapeBinder, positive_scale, values_in_range

OP = "sparse_mla"
QUERY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@torch.library.custom_op("dsahal::sparse_mla", mutates_args=())
def _sparse_mla_op(
    q: torch.Tensor, kv_pages: torch.Tensor, slots: torch.Tensor, kv_fmt: str,
    kv_scale: Optional[torch.Tensor], softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return active_table().dispatch[OP](q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


@_sparse_mla_op.register_fake
def _(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    t, h, _ = q.shape
    return q.new_empty((t, h, LATENT_NOPE_DIM)), q.new_empty((t, h), dtype=torch.float32)


def check_sparse_mla_args(v: ShapeBinder, q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> None:
    """Sparse MLA's checks on binder ``v`` (its op name is the caller's: ``dsa_attention`` checks its MLA
    stage under its own name). ``slots=None`` checks everything but the slots (a composite computes them)."""
    if not isinstance(kv_fmt, str) or kv_fmt not in LATENT_FORMATS:
        v.fail(f"argument 'kv_fmt' expected a latent format, one of {sorted(LATENT_FORMATS)}, got {kv_fmt!r}")
    spec = latent_format(kv_fmt)
    v.tensor("q", q, ["T", "H", LATENT_DIM], QUERY_DTYPES)
    v.tensor("kv_pages", kv_pages, [None, None, spec.token_bytes], torch.uint8, last_dim_contiguous=True)
    v.disjoint("kv_pages", kv_pages, "[block, token] records")
    num_slots = kv_pages.shape[0] * kv_pages.shape[1]
    v.at_most("kv_pages", num_slots, INT32_MAX + 1, "num_blocks * block_tokens (slots are int32)")
    if slots is not None:
        v.tensor("slots", slots, ["T", "K"], INDEX_DTYPES)
    if spec.needs_tensor_scale:
        v.tensor("kv_scale", kv_scale, [], torch.float32)
    elif kv_scale is not None:
        v.fail(f"argument 'kv_scale' expected None for latent format {kv_fmt!r}, got a tensor")
    v.positive_float("softmax_scale", softmax_scale)
    v.same_device(q=q, kv_pages=kv_pages, slots=slots, kv_scale=kv_scale)
    v.has_data("q", q)
    if spec.needs_tensor_scale:  # read even when every row is empty: a zero scale is a wrong call, used or not
        positive_scale(v.op, "kv_scale", kv_scale, spec)
    if slots is not None:
        values_in_range(v.op, "slots", slots, -1, num_slots - 1, what=" (-1 is skipped)")


def validate_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> None:
    v = ShapeBinder(OP)
    if slots is None:  # the op itself always takes slots (only a composite's stage checks the rest without them)
        v.tensor("slots", slots, ["T", "K"], INDEX_DTYPES)
    check_sparse_mla_args(v, q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)


def sparse_mla(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    slots: torch.Tensor,
    *,
    kv_fmt: str,
    kv_scale: Optional[torch.Tensor] = None,
    softmax_scale: float,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``o[t, h] = softmax_{s ∈ I(t)}(softmax_scale · q[t, h] · kv[s]) · kv[s, :512]``.

    ``I(t)`` is the set of valid entries of ``slots[t]`` (-1 entries are skipped; a slot listed
    twice counts twice, as in a dense softmax over a list). Serves prefill and decode alike.

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp32 absorbed queries (512 latent + 64 RoPE dims).
        kv_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 latent pages in ``kv_fmt``; may be a
            strided view into the packed pool, but no two records may share bytes.
        slots: ``[T, K]`` int32 physical slots; -1 skipped.
        kv_fmt: latent format name (``"bf16"``, ``"fp8"``, ``"fp8_ds_mla"``, ``"nvfp4"``).
        kv_scale: ``[]`` fp32 per-tensor scale for ``"fp8"`` (finite, > 0), else None.
        softmax_scale: always explicit (the model's is ``192^-0.5 · mscale²``, not ``576^-0.5``). The
            scaled logits must stay finite in fp32 (``lse`` is fp32): a scale that overflows them is
            outside the contract (backends differ there).

    Returns:
        ``o``: ``[T, H, 512]`` in q's dtype; ``lse``: ``[T, H]`` fp32 natural-log sum-exp of the
        scaled logits. A row with no valid slot gives ``o = 0`` and ``lse = -inf``.
    """
    if check:
        validate_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)
    slots = unit_last(slots)
    if holds_no_record(kv_pages):  # every slot -1 (checked): no route asked (._empty)
        return attention_without_keys(q)
    if tracing():
        return torch.ops.dsahal.sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, float(softmax_scale))
    return active_table().dispatch[OP](q, kv_pages, slots, kv_fmt, kv_scale, float(softmax_scale))


def default_mla_softmax_scale(qk_head_dim: int = 192, mscale: float = 1.0) -> float:
    """``qk_head_dim^-0.5 · mscale²``: the DeepSeek/Kimi MLA scale (192 = 128 nope + 64 rope)."""
    return mscale * mscale / math.sqrt(qk_head_dim)
