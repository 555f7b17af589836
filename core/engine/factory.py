"""Building the packed cache an engine needs, sized from its request limits."""
from __future__ import annotations

import math

import torch

from ..cache import DEFAULT_ROW_ROUNDING, PackedKVCache, plan_layout


def cache_rows_needed(layout, *, max_batch: int, max_context: int, context_shards: int = 1) -> int:
    """Rows for ``max_batch`` requests of up to ``max_context`` tokens: their blocks plus their KDA
    states (``rows_per_state`` aligned rows each). Under decode context parallelism each of the
    ``context_shards`` ranks stores every W-th token, so a request needs 1/W of the blocks."""
    blocks_per_request = math.ceil(math.ceil(max_context / context_shards) / layout.block_tokens)
    return max_batch * (blocks_per_request + layout.rows_per_state)


def build_cache(config, *, max_batch: int, max_context: int, latent_fmt: str = "bf16", index_fmt: str = "fp8",
                block_tokens: int = 64, device: str | torch.device = "cpu", tp: int = 1,
                context_shards: int = 1, row_rounding: str = DEFAULT_ROW_ROUNDING) -> PackedKVCache:
    """A :class:`~dsahal.cache.PackedKVCache` that holds ``max_batch`` requests of ``max_context`` tokens.

    ``row_rounding``: the planner's rule (``"page"``: 256-byte multiples, the default; ``"pow2"``), so the
    engine allocates exactly the rows ``dsahal plan`` describes."""
    layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens, tp=tp,
                         dcp=context_shards, row_rounding=row_rounding)
    rows = cache_rows_needed(layout, max_batch=max_batch, max_context=max_context, context_shards=context_shards)
    return PackedKVCache(layout, rows, device)
