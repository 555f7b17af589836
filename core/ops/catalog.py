"""The names of every op of the interface, in the order reports list them."""

OP_NAMES = (
    "cache_write",
    "indexer_score",
    "topk",
    "topk_merge",
    "positions_to_slots",
    "sparse_mla",
    "lse_combine",
    "kda_decode",
    "kda_prefill",
    "all_gather",
    "all_to_all",
    "dsa_attention",
)

# Ops whose default, when a backend lacks them, is the composition of the backend's own ops.
COMPOSITE_OPS = frozenset({"dsa_attention"})

# Ops that talk to other ranks: plain Python functions (a process group is not a schema type).
COLLECTIVE_OPS = frozenset({"topk_merge", "all_gather", "all_to_all"})
