"""``dsahal.ops.composite.dsa_attention``: what a backend that does not fuse ``dsa_attention`` gets — each
stage through the public ``dsahal.ops`` function (so on the backend's own route for it), unvalidated,
and the same result as the reference's own composition."""
from __future__ import annotations

import torch

from dsahal import ops
from dsahal.ops import composite
from dsahal.ops.catalog import SPECS
from dsahal.reference import dsa_attention as reference
from test_reference_ops import _paged_cache

STAGES = ("indexer_score", "topk", "positions_to_slots", "sparse_mla")


def _inputs():
    gen = torch.Generator().manual_seed(9)
    index_pages, _, _ = _paged_cache(4, 8, "index", "fp8", 1)
    kv_pages, _, _ = _paged_cache(4, 8, "latent", "bf16", 2)
    block_table = torch.tensor([[2, 0, 3, -1], [1, -1, -1, -1]], dtype=torch.int32)  # unmapped blocks too
    positions = torch.tensor([5, 20, 23, 3], dtype=torch.int32)
    req_ids = torch.tensor([0, 0, 0, 1], dtype=torch.int32)
    q_index, weights = torch.randn(4, 2, 128, generator=gen), torch.rand(4, 2, generator=gen)
    q = torch.randn(4, 4, 576, generator=gen)
    # in the op spec's order, as the registry passes them to a route
    return (q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions, "fp8", "bf16", None, 6, 32,
            0.1)


def test_the_composite_and_the_reference_take_the_op_specs_arguments():
    import inspect

    for fn in (composite.dsa_attention, reference.dsa_attention):
        assert tuple(inspect.signature(fn).parameters) == SPECS["dsa_attention"].params


def test_each_stage_goes_through_the_public_op_unvalidated(monkeypatch):
    calls = []
    for name in STAGES:
        public = getattr(ops, name)

        def recording(*args, _name=name, _public=public, **kwargs):
            calls.append((_name, kwargs.get("check")))
            return _public(*args, **kwargs)

        monkeypatch.setattr(ops, name, recording)
    o, lse = composite.dsa_attention(*_inputs())
    assert calls == [(name, False) for name in STAGES]
    want_o, want_lse = reference.dsa_attention(*_inputs())
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)  # the reference serves every stage here
    assert o.shape == (4, 4, 512) and lse.shape == (4, 4)
