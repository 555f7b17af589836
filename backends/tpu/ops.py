"""The TPU backend's op table: each XLA formulation behind the XLA-device check.

Importing this module imports torch_xla; the plugin refers to it lazily (``"module:attr"``)
so discovery never does."""
from __future__ import annotations

from . import cache, collectives, dsa_attention as dsa, indexer, kda, lse_combine as lse, slots, sparse_mla as mla
from . import topk as top
from .device import require_xla
from .functionalize import register as _register_functionalize_kernels

_register_functionalize_kernels()

cache_write = require_xla("cache_write")(cache.cache_write)
indexer_score = require_xla("indexer_score")(indexer.indexer_score)
topk = require_xla("topk")(top.topk)
topk_merge = require_xla("topk_merge")(top.topk_merge)
positions_to_slots = require_xla("positions_to_slots")(slots.positions_to_slots)
sparse_mla = require_xla("sparse_mla")(mla.sparse_mla)
lse_combine = require_xla("lse_combine")(lse.lse_combine)
kda_decode = require_xla("kda_decode")(kda.kda_decode)
kda_prefill = require_xla("kda_prefill")(kda.kda_prefill)
all_gather = require_xla("all_gather")(collectives.all_gather)
all_to_all = require_xla("all_to_all")(collectives.all_to_all)
dsa_attention = require_xla("dsa_attention")(dsa.dsa_attention)
