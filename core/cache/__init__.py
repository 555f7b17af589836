"""The packed KV cache (DESIGN §5): one row pool for every DSA layer's latent and index-key pages and
every request's KDA state (recurrent and short-conv), per-layer strided views for kernels, and a row allocator
(capacity planning, a consumer of the layout, is :mod:`dsahal.cli.capacity`).

    from dsahal.cache import PackedKVCache, plan_layout
    layout = plan_layout(load_config("tiny"), latent_fmt="nvfp4", index_fmt="mxfp4", block_tokens=64)
    cache = PackedKVCache.from_budget(layout, 64 << 20)
    blocks = cache.allocate_blocks(4)
    dsahal.ops.cache_write(latent, slots, cache.latent_pages(3), kind="latent", fmt="nvfp4")
"""
from .allocator import BLOCK, FREE, STATE, CacheFullError, RowAllocator
from .layout import (DEFAULT_ROW_ROUNDING, KDA_CONV_KERNEL, PAGE_ALIGN, ROW_ROUNDINGS, CacheLayout, PageSpec, StateSpec,
                     conv_state_offset, kda_conv_kernel, next_power_of_two, plan_layout)
from .packed import PackedKVCache

__all__ = [
    "CacheLayout", "PageSpec", "StateSpec", "plan_layout", "PackedKVCache", "RowAllocator", "CacheFullError",
    "DEFAULT_ROW_ROUNDING", "KDA_CONV_KERNEL", "conv_state_offset", "kda_conv_kernel", "PAGE_ALIGN",
    "ROW_ROUNDINGS", "next_power_of_two", "FREE", "BLOCK", "STATE",
]

# Moved to the planner (sixth session): the old names still resolve, by string (the contract imports no
# consumer), with a deprecation warning.
_MOVED_TO_PLANNER = frozenset({"Capacity", "Comparison", "PaddedLayout", "capacity", "compare", "padded_layouts",
                               "standard_comparisons"})


def __getattr__(name: str):
    if name not in _MOVED_TO_PLANNER:
        raise AttributeError(f"module 'dsahal.cache' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"dsahal.cache.{name} is deprecated: use dsahal.cli.capacity.{name}", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("dsahal.cli.capacity"), name)
