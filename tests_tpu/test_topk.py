"""Exact top-k through XLA TopK: the reference's set under the tie rule, -inf never chosen."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from dsahal import ops

from conftest import on_reference, on_tpu


def as_sets(indices: torch.Tensor) -> list[list[int]]:
    return [sorted(int(i) for i in row if i >= 0) for row in indices.cpu()]


def assert_same_selection(scores, lengths, k, xla):
    expected = on_reference(ops.topk, scores, lengths, k)
    got = on_tpu(ops.topk, scores.to(xla), lengths.to(xla), k).cpu()
    assert got.dtype == torch.int32 and got.shape == (scores.shape[0], k)
    assert as_sets(got) == as_sets(expected)
    valid = got >= 0  # valid entries first, -1 padding last
    assert bool((valid.int().diff(dim=1) <= 0).all())


def test_ties_at_the_boundary_go_to_the_smaller_index(xla):
    scores = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0, 2.0]])
    got = on_tpu(ops.topk, scores.to(xla), torch.tensor([8], dtype=torch.int32).to(xla), 3).cpu()
    assert as_sets(got) == [[1, 2, 3]]


def test_minus_inf_is_never_selected_and_short_rows_are_padded(xla):
    inf = float("-inf")
    scores = torch.tensor([[inf, 5.0, inf, -1e30, inf], [inf, inf, inf, inf, inf]])
    lengths = torch.tensor([5, 5], dtype=torch.int32)
    got = on_tpu(ops.topk, scores.to(xla), lengths.to(xla), 4).cpu()
    assert got.tolist() == [[1, 3, -1, -1], [-1, -1, -1, -1]]


def test_entries_past_the_length_are_ignored_and_k_may_exceed_the_width(xla):
    scores = torch.arange(6, dtype=torch.float32).repeat(3, 1)
    lengths = torch.tensor([6, 2, 0], dtype=torch.int32)
    assert_same_selection(scores, lengths, 9, xla)


@settings(max_examples=6, deadline=None, database=None)
@given(seed=st.integers(0, 2**31 - 1), levels=st.sampled_from([3, 1000]), k=st.sampled_from([1, 7, 40]))
def test_heavy_ties_match_the_reference_set(seed, levels, k, xla):
    # One shape (8 x 48) for every example: one compiled graph per k.
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (8, 48), generator=gen).float() - levels / 2
    scores[torch.rand(8, 48, generator=gen) < 0.2] = float("-inf")
    scores[1, :] = 0.0  # a row of ties only
    scores[2, :] = -0.0 * torch.ones(48) * torch.where(torch.arange(48) % 2 == 0, 1.0, -1.0)  # +0 and -0 tie
    lengths = torch.randint(0, 49, (8,), generator=gen).to(torch.int32)
    assert_same_selection(scores, lengths, k, xla)

