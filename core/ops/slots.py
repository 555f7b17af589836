"""Position-to-slot translation: request-relative token positions to physical cache slots."""
from __future__ import annotations

import torch

from ..registry.state import active_table
from ._dispatch import tracing
from ._layout import unit_last
from ._validate import INDEX_DTYPES, INT32_MAX, ShapeBinder, values_in_range

OP = "positions_to_slots"


@torch.library.custom_op("dsahal::positions_to_slots", mutates_args=())
def _positions_to_slots_op(
    positions: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor, block_tokens: int
) -> torch.Tensor:
    return active_table().dispatch[OP](positions, req_ids, block_table, block_tokens)


@_positions_to_slots_op.register_fake
def _(positions, req_ids, block_table, block_tokens):
    return torch.empty_like(positions, dtype=torch.int32)


def validate_positions_to_slots(positions, req_ids, block_table, block_tokens) -> None:
    v = ShapeBinder(OP)
    v.tensor("positions", positions, ["T", "K"], INDEX_DTYPES)
    v.tensor("req_ids", req_ids, ["T"], INDEX_DTYPES)
    v.tensor("block_table", block_table, ["B", None], INDEX_DTYPES)
    v.positive_int("block_tokens", block_tokens)
    v.at_most("block_tokens", block_tokens, INT32_MAX, "a count")
    v.at_most("block_table", block_table.shape[1] * block_tokens, INT32_MAX + 1,
              "max_blocks * block_tokens (positions are int32)")
    v.same_device(positions=positions, req_ids=req_ids, block_table=block_table)
    if block_table.shape[1] == 0 and positions.numel():
        # Every position must then be -1, and routes that gather the block before masking (the reference's
        # gather, XLA's, the portable one) index column 0 of an empty row: a table of no blocks is no table.
        v.fail(f"argument 'block_table' expected at least one block per row when there are positions to "
               f"translate, got shape {list(block_table.shape)}")
    values_in_range(OP, "req_ids", req_ids, 0, v.sizes["B"] - 1)
    # A slot is block * block_tokens + offset in int32: the largest block id whose last slot still fits.
    max_block = (INT32_MAX + 1) // block_tokens - 1
    values_in_range(OP, "block_table", block_table, -1, max_block,
                    what=f" (-1: unmapped; block * {block_tokens} + offset must fit an int32 slot)")
    values_in_range(OP, "positions", positions, -1, block_table.shape[1] * block_tokens - 1,
                    what=" (-1 is padding)")


def positions_to_slots(
    positions: torch.Tensor,
    req_ids: torch.Tensor,
    block_table: torch.Tensor,
    block_tokens: int,
    *,
    check: bool = True,
) -> torch.Tensor:
    """``slot = block_table[req, pos // block_tokens] * block_tokens + pos % block_tokens``.

    Args:
        positions: ``[T, K]`` int32 request-relative positions (a top-k result); -1 is padding.
        req_ids: ``[T]`` int32 request of each row.
        block_table: ``[B, max_blocks]`` int32; -1 marks an unmapped block (no other negative value; every
            ``block * block_tokens + block_tokens - 1`` fits an int32).
        block_tokens: tokens per cache block.

    Returns:
        ``[T, K]`` int32 physical slots; -1 where the position is -1 or its block is unmapped.
    """
    if check:
        validate_positions_to_slots(positions, req_ids, block_table, block_tokens)
    positions, req_ids, block_table = unit_last(positions), unit_last(req_ids), unit_last(block_table)
    if tracing():
        return torch.ops.dsahal.positions_to_slots(positions, req_ids, block_table, block_tokens)
    return active_table().dispatch[OP](positions, req_ids, block_table, block_tokens)
