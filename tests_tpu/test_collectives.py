"""Collectives at world size 1 (no process group): identities, and the DCP merge is plain top-k.

Multi-rank runs need a torch-xla process group over several XLA devices, which this CI does not
start; those paths are unverified (see the backend's capabilities: distributed=False)."""
from __future__ import annotations

import torch

import dsahal
from dsahal import ops

from conftest import on_reference, on_tpu


def test_all_gather_at_world_size_one_adds_a_leading_rank_dim(xla):
    x = torch.randn(3, 5)
    got = on_tpu(ops.all_gather, x.to(xla)).cpu()
    assert torch.equal(got, x[None])


def test_all_to_all_at_world_size_one_returns_its_input(xla):
    x = torch.randn(6, 2)
    got = on_tpu(ops.all_to_all, x.to(xla), [6], [6]).cpu()
    assert torch.equal(got, x)


def test_topk_merge_at_world_size_one_equals_topk(xla):
    scores = torch.randint(0, 4, (5, 30)).float()
    lengths = torch.tensor([30, 12, 0, 7, 29], dtype=torch.int32)
    with dsahal.use_backend("tpu"), dsahal.observe(dsahal.CallLog()) as log:
        got = ops.topk_merge(scores.to(xla), lengths.to(xla), 6).cpu()
    assert [(c.op, c.route, c.fallback) for c in log.calls][:1] == [("topk_merge", "xla", False)]
    assert log.count(fallback=True) == 0
    expected = on_reference(ops.topk, scores, lengths, 6)
    assert [sorted(r.tolist()) for r in got] == [sorted(r.tolist()) for r in expected]
