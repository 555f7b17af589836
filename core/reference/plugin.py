"""The reference backend as a plugin: pure torch, any device, fp32/fp64 math. The oracle."""
from __future__ import annotations

from ..ops.catalog import OP_NAMES
from ..registry import Backend, Capabilities, hookimpl

_MODULE_OF = {
    "cache_write": "cache", "indexer_score": "indexer", "topk": "topk", "topk_merge": "topk",
    "positions_to_slots": "slots", "sparse_mla": "sparse_mla", "lse_combine": "lse_combine",
    "kda_decode": "kda", "kda_prefill": "kda", "all_gather": "collectives", "all_to_all": "collectives",
    "dsa_attention": "dsa_attention",
}


def reference_backend() -> Backend:
    return Backend(
        name="reference",
        ops={op: f"dsahal.reference.{_MODULE_OF[op]}:{op}" for op in OP_NAMES},
        tags=frozenset({"reference", "cpu", "any-device"}),
        priority=0,
        capabilities=Capabilities(deterministic=True, batch_invariant=False, distributed=True),
        description="pure-torch float64 oracle; runs on any device",
    )


@hookimpl
def dsahal_backends():
    return [reference_backend()]
