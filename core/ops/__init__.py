"""The op interface: every attention op of a hybrid DSA + KDA model, backend-neutral.

Each function validates its arguments (``check=False`` skips it on hot paths that validated
already), then dispatches to the selected backend through a table resolved once per process.
The non-collective ops are ``torch.library`` custom ops (``torch.ops.dsahal.*``) with fake
implementations, so a graph calling them traces under ``torch.compile`` without graph breaks.
"""
from .cache_write import cache_write
from .catalog import COLLECTIVE_OPS, COMPOSITE_OPS, OP_NAMES
from .collectives import all_gather, all_to_all, group_rank_and_size
from .dsa_attention import dsa_attention
from .indexer import indexer_score
from .kda import kda_decode, kda_prefill
from .lse_combine import lse_combine
from .slots import positions_to_slots
from .sparse_mla import default_mla_softmax_scale, sparse_mla
from .topk import topk
from .topk_merge import topk_merge

__all__ = [
    "cache_write", "indexer_score", "topk", "topk_merge", "positions_to_slots", "sparse_mla", "lse_combine",
    "kda_decode", "kda_prefill", "all_gather", "all_to_all", "dsa_attention", "default_mla_softmax_scale",
    "group_rank_and_size", "OP_NAMES", "COMPOSITE_OPS", "COLLECTIVE_OPS",
]
