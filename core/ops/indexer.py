"""Indexer score: the lightning indexer's relevance of every visible past token to each query token."""
from __future__ import annotations

import torch

from ..formats import INDEX_DIM, INDEX_FORMATS, index_format
from ..registry.state import active_table
from ._dispatch import tracing
from ._empty import holds_no_record, scores_without_keys
from ._layout import unit_last
from ._validate import INDEX_DTYPES, INT32_MAX, ShapeBinder, values_in_range

OP = "indexer_score"
QUERY_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)


@torch.library.custom_op("dsahal::indexer_score", mutates_args=())
def _indexer_score_op(
    q: torch.Tensor, weights: torch.Tensor, index_pages: torch.Tensor, block_table: torch.Tensor,
    req_ids: torch.Tensor, positions: torch.Tensor, index_fmt: str, max_context: int,
) -> torch.Tensor:
    return active_table().dispatch[OP](q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context)


@_indexer_score_op.register_fake
def _(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    return q.new_empty((q.shape[0], max_context), dtype=torch.float32)


def validate_batch_metadata(v: ShapeBinder, block_table, req_ids, positions, block_tokens: int) -> None:
    """Shared checks of the per-token batch metadata used by indexer, slot translation and DSA."""
    v.tensor("block_table", block_table, ["B", None], INDEX_DTYPES)
    v.tensor("req_ids", req_ids, ["T"], INDEX_DTYPES)
    v.tensor("positions", positions, ["T"], INDEX_DTYPES)
    capacity = block_table.shape[1] * block_tokens
    v.at_most("block_table", capacity, INT32_MAX + 1, "max_blocks * block_tokens (positions are int32)")
    values_in_range(v.op, "req_ids", req_ids, 0, v.sizes["B"] - 1, what=" (a row of block_table)")
    values_in_range(v.op, "positions", positions, 0, capacity - 1,
                    what=f" (block_table maps {block_table.shape[1]} blocks of {block_tokens} tokens)")


def check_indexer_args(v: ShapeBinder, q, weights, index_pages, block_table, req_ids, positions, index_fmt,
                       max_context, *, q_name: str = "q", weights_name: str = "weights", heads: str = "H") -> None:
    """The indexer's checks on binder ``v``, under the caller's argument names: a composite op
    (``dsa_attention``) validates its indexer stage under its own op name and its own argument names
    (``q_index``, ``index_weights``) and heads dimension (``Hi``)."""
    if not isinstance(index_fmt, str) or index_fmt not in INDEX_FORMATS:
        v.fail(f"argument 'index_fmt' expected an index format, one of {sorted(INDEX_FORMATS)}, got {index_fmt!r}")
    spec = index_format(index_fmt)
    v.tensor(q_name, q, ["T", heads, INDEX_DIM], QUERY_DTYPES)
    v.tensor(weights_name, weights, ["T", heads], torch.float32)
    v.tensor("index_pages", index_pages, [None, None, spec.token_bytes], torch.uint8, last_dim_contiguous=True)
    v.disjoint("index_pages", index_pages, "[block, token] records")
    v.at_most("index_pages", index_pages.shape[0] * index_pages.shape[1], INT32_MAX + 1,
              "num_blocks * block_tokens (slots are int32)")
    v.positive_int("max_context", max_context)
    v.at_most("max_context", max_context, INT32_MAX, "a width")
    validate_batch_metadata(v, block_table, req_ids, positions, index_pages.shape[1])
    values_in_range(v.op, "block_table", block_table, -1, index_pages.shape[0] - 1, what=" (-1: unmapped)")
    v.same_device(**{q_name: q, weights_name: weights, "index_pages": index_pages, "block_table": block_table,
                     "req_ids": req_ids, "positions": positions})
    v.has_data("positions", positions)


def validate_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    check_indexer_args(ShapeBinder(OP), q, weights, index_pages, block_table, req_ids, positions, index_fmt,
                       max_context)


def indexer_score(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_pages: torch.Tensor,
    block_table: torch.Tensor,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    index_fmt: str,
    max_context: int,
    check: bool = True,
) -> torch.Tensor:
    """``score[t, s] = Σ_h weights[t, h] · relu(q[t, h] · k[s]) · k_scale[s]`` for ``s <= positions[t]``.

    Key ``s`` of token ``t`` is read from the page ``block_table[req_ids[t], s // block_tokens]``
    at offset ``s % block_tokens``, dequantised from ``index_fmt``.

    Args:
        q: ``[T, H, 128]`` bf16/fp16/fp32, or float8_e4m3fn with its per-(token, head) scale
            already folded into ``weights``.
        weights: ``[T, H]`` fp32 head weights (softmax scale and q scale folded in).
        index_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 index-key pages; may be a strided
            view into the packed pool, but no two records may share bytes.
        block_table: ``[B, max_blocks]`` int32 physical block of each request's logical block; -1 unmapped
            (no other negative value).
        req_ids: ``[T]`` int32 request (row of ``block_table``) of each query token.
        positions: ``[T]`` int32 position of each query token in its request; it sees keys
            ``0..positions[t]`` (causal, its own key included).
        index_fmt: index-key format name (``"bf16"``, ``"fp8"``, ``"mxfp4"``).
        max_context: width of the output.

    Returns:
        ``[T, max_context]`` fp32; entries past ``positions[t]`` (or on unmapped blocks) are -inf.
    """
    if check:
        validate_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context)
    block_table, req_ids, positions = unit_last(block_table), unit_last(req_ids), unit_last(positions)
    if holds_no_record(index_pages):  # every block unmapped (checked): no route asked (._empty)
        return scores_without_keys(q, max_context)
    if tracing():
        return torch.ops.dsahal.indexer_score(q, weights, index_pages, block_table, req_ids, positions,
                                          index_fmt, max_context)
    return active_table().dispatch[OP](q, weights, index_pages, block_table, req_ids, positions,
                                          index_fmt, max_context)
