"""LSE combine and position-to-slot translation on XLA against the reference."""
from __future__ import annotations

import torch

from dsahal import ops

from conftest import assert_close, on_reference, on_tpu, to


def test_lse_combine_matches_the_reference_with_minus_inf_parts(xla):
    gen = torch.Generator().manual_seed(0)
    o_parts = torch.randn(3, 5, 2, 16, generator=gen)
    lse_parts = torch.randn(3, 5, 2, generator=gen) * 4
    lse_parts[:, 0, 0] = float("-inf")  # every part empty: o = 0, lse = -inf
    lse_parts[1, 2, :] = float("-inf")  # one empty part contributes nothing
    expected = on_reference(ops.lse_combine, o_parts, lse_parts)
    got = on_tpu(ops.lse_combine, *to(xla, o_parts, lse_parts))
    assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5, what="o")
    assert_close(got[1], expected[1], atol=1e-6, rtol=1e-6, what="lse")
    assert bool((got[0][0, 0].cpu() == 0).all())


def test_positions_to_slots_matches_the_reference_with_padding_and_unmapped_blocks(xla):
    positions = torch.tensor([[0, 5, -1, 31], [12, -1, 7, 20], [-1, -1, -1, -1]], dtype=torch.int32)
    req_ids = torch.tensor([1, 0, 1], dtype=torch.int32)
    block_table = torch.tensor([[4, -1, 2, 0], [1, 3, -1, 5]], dtype=torch.int32)
    args = (positions, req_ids, block_table, 8)
    expected = on_reference(ops.positions_to_slots, *args)
    got = on_tpu(ops.positions_to_slots, *to(xla, *args)).cpu()
    assert got.dtype == torch.int32
    assert torch.equal(got, expected)
