"""One DSA layer's attention: indexer -> top-k -> position-to-slot -> sparse MLA (optionally fused)."""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import INDEX_DIM, LATENT_DIM, LATENT_NOPE_DIM
from ..registry.state import active_table
from ._dispatch import tracing
from ._empty import attention_without_keys, holds_no_record
from ._layout import unit_last
from ._validate import INT32_MAX, ShapeBinder, values_in_range
from .indexer import QUERY_DTYPES as INDEX_QUERY_DTYPES
from .indexer import check_indexer_args
from .sparse_mla import QUERY_DTYPES, check_sparse_mla_args

OP = "dsa_attention"


@torch.library.custom_op("dsahal::dsa_attention", mutates_args=())
def _dsa_attention_op(
    q_index: torch.Tensor, index_weights: torch.Tensor, index_pages: torch.Tensor, q: torch.Tensor,
    kv_pages: torch.Tensor, block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor,
    index_fmt: str, kv_fmt: str, kv_scale: Optional[torch.Tensor], topk: int, max_context: int,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return active_table().dispatch[OP](q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids,
                                       positions, index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale)


@_dsa_attention_op.register_fake
def _(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt, kv_fmt,
      kv_scale, topk, max_context, softmax_scale):
    t, h, _ = q.shape
    return q.new_empty((t, h, LATENT_NOPE_DIM)), q.new_empty((t, h), dtype=torch.float32)


def validate_dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                           index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale) -> None:
    """Every check of its stages, under this op's name and its own argument names: one binder, where the
    indexer's heads are ``Hi`` and the MLA heads ``H`` (a caller never sees ``dsahal.sparse_mla`` or ``weights``)."""
    v = ShapeBinder(OP)
    v.tensor("q_index", q_index, ["T", "Hi", INDEX_DIM], INDEX_QUERY_DTYPES)
    v.tensor("q", q, ["T", "H", LATENT_DIM], QUERY_DTYPES)
    v.positive_int("topk", topk)
    v.at_most("topk", topk, INT32_MAX, "a count")
    check_indexer_args(v, q_index, index_weights, index_pages, block_table, req_ids, positions, index_fmt,
                       max_context, q_name="q_index", weights_name="index_weights", heads="Hi")
    # The indexer scores positions 0..max_context-1: a query past them would attend to keys it never ranked.
    values_in_range(OP, "positions", positions, 0, max_context - 1, what=f" (max_context={max_context} must be "
                    "at least every position + 1)")
    if isinstance(kv_pages, torch.Tensor) and kv_pages.dim() == 3 and kv_pages.shape[:2] != index_pages.shape[:2]:
        v.fail(f"argument 'kv_pages' expected the same [num_blocks, block_tokens] as index_pages "
               f"{list(index_pages.shape[:2])}, got {list(kv_pages.shape[:2])}")
    check_sparse_mla_args(v, q, kv_pages, None, kv_fmt, kv_scale, softmax_scale)
    v.same_device(q_index=q_index, q=q, kv_pages=kv_pages)


def dsa_attention(
    q_index: torch.Tensor, index_weights: torch.Tensor, index_pages: torch.Tensor, q: torch.Tensor,
    kv_pages: torch.Tensor, block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor, *,
    index_fmt: str, kv_fmt: str, kv_scale: Optional[torch.Tensor] = None, topk: int, max_context: int,
    softmax_scale: float, check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of one DSA layer; exactly the composition
    ``sparse_mla(q, positions_to_slots(topk(indexer_score(...), positions + 1, topk)))``.

    Args:
        q_index: ``[T, Hi, 128]`` indexer queries; index_weights: ``[T, Hi]`` fp32.
        index_pages: ``[num_blocks, block_tokens, index_bytes]`` uint8.
        q: ``[T, H, 576]`` absorbed MLA queries.
        kv_pages: ``[num_blocks, block_tokens, latent_bytes]`` uint8 (same blocks as index_pages).
        block_table: ``[B, max_blocks]`` int32; req_ids, positions: ``[T]`` int32.
        topk: tokens each query attends to; max_context: indexer score width (≥ every position + 1:
            a position beyond ``max_context - 1`` is rejected).

    Returns:
        ``o`` ``[T, H, 512]`` in q's dtype and ``lse`` ``[T, H]`` fp32.
    """
    if check:  # the caller's own softmax_scale: a float() first would let a tensor, bool or string through
        validate_dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                               index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale)
    args = (q_index, index_weights, index_pages, q, kv_pages, unit_last(block_table), unit_last(req_ids),
            unit_last(positions), index_fmt, kv_fmt, kv_scale, topk, max_context, float(softmax_scale))
    if holds_no_record(index_pages) or holds_no_record(kv_pages):  # every block unmapped (checked): no route asked
        return attention_without_keys(q)
    if tracing():
        return torch.ops.dsahal.dsa_attention(*args)
    return active_table().dispatch[OP](*args)
