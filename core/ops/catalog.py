"""One spec per op: its name and the names and order of its arguments.

The order is shared by everything that handles the op: the public wrapper in :mod:`dsahal.ops`
(positional arguments first, then the keyword-only ones, ``check`` aside), the ``torch.library``
custom op and its fake, the validator, and every backend route and verifier, which the registry
calls positionally in exactly this order. ``tests/test_op_spec.py`` holds all of them to it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    """The contract's shape of one op.

    Attributes:
        name: the op's name (``dsahal.ops.<name>``, ``torch.ops.dsahal.<name>``).
        params: argument names in the order every implementation receives them.
        mutates: arguments written in place.
        collective: talks to other ranks (a plain Python function: a process group is no schema type).
        composite: when a backend lacks it, the composition of the backend's own ops serves it.
    """

    name: str
    params: tuple[str, ...]
    mutates: tuple[str, ...] = ()
    collective: bool = False
    composite: bool = False


SPECS: dict[str, OpSpec] = {spec.name: spec for spec in (
    OpSpec("cache_write", ("values", "slots", "pages", "kind", "fmt", "scale"), mutates=("pages",)),
    OpSpec("indexer_score", ("q", "weights", "index_pages", "block_table", "req_ids", "positions", "index_fmt",
                             "max_context")),
    OpSpec("topk", ("scores", "lengths", "k")),
    OpSpec("topk_merge", ("local_scores", "local_lengths", "k", "group"), collective=True),
    OpSpec("positions_to_slots", ("positions", "req_ids", "block_table", "block_tokens")),
    OpSpec("sparse_mla", ("q", "kv_pages", "slots", "kv_fmt", "kv_scale", "softmax_scale")),
    OpSpec("lse_combine", ("o_parts", "lse_parts")),
    OpSpec("kda_decode", ("q", "k", "v", "g", "beta", "state_pool", "state_ids", "scale", "use_qk_l2norm"),
           mutates=("state_pool",)),
    OpSpec("kda_prefill", ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_ids", "scale",
                           "use_qk_l2norm"), mutates=("state_pool",)),
    OpSpec("all_gather", ("x", "group"), collective=True),
    OpSpec("all_to_all", ("x", "output_split_sizes", "input_split_sizes", "group"), collective=True),
    OpSpec("dsa_attention", ("q_index", "index_weights", "index_pages", "q", "kv_pages", "block_table", "req_ids",
                             "positions", "index_fmt", "kv_fmt", "kv_scale", "topk", "max_context",
                             "softmax_scale"), composite=True),
)}

# The names of every op of the interface, in the order reports list them.
OP_NAMES = tuple(SPECS)

# Ops whose default, when a backend lacks them, is the composition of the backend's own ops.
COMPOSITE_OPS = frozenset(name for name, spec in SPECS.items() if spec.composite)

# Ops that talk to other ranks: plain Python functions (a process group is not a schema type).
COLLECTIVE_OPS = frozenset(name for name, spec in SPECS.items() if spec.collective)
