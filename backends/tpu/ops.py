"""The TPU backend's op table: each XLA formulation behind the device handling of :mod:`.device`.

Importing this module imports torch_xla; the plugin refers to it lazily (``"module:attr"``)
so discovery never does."""
from __future__ import annotations

from . import cache, collectives, dsa_attention as dsa, indexer, kda, lse_combine as lse, slots, sparse_mla as mla
from . import topk as top
from .device import on_xla
from .functionalize import register as _register_functionalize_kernels

_register_functionalize_kernels()

cache_write = on_xla("cache_write", mutated=("pages",))(cache.cache_write)
indexer_score = on_xla("indexer_score")(indexer.indexer_score)
topk = on_xla("topk")(top.topk)
topk_merge = on_xla("topk_merge")(top.topk_merge)
positions_to_slots = on_xla("positions_to_slots")(slots.positions_to_slots)
sparse_mla = on_xla("sparse_mla")(mla.sparse_mla)
lse_combine = on_xla("lse_combine")(lse.lse_combine)
kda_decode = on_xla("kda_decode", mutated=("state_pool",))(kda.kda_decode)
kda_prefill = on_xla("kda_prefill", mutated=("state_pool",))(kda.kda_prefill)
all_gather = on_xla("all_gather")(collectives.all_gather)
all_to_all = on_xla("all_to_all")(collectives.all_to_all)
dsa_attention = on_xla("dsa_attention")(dsa.dsa_attention)
