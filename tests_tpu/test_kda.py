"""KDA on XLA: the decode step and the scanned chunked prefill against the float64 reference,
with padding ids (-1), empty sequences, sequences spanning several chunks, strong decays."""
from __future__ import annotations

import torch
import torch_xla

from dsahal import ops
from dsahal.backends.tpu.kda import CHUNK_SIZE

from conftest import assert_close, on_reference, on_tpu, to

HEADS, KEY_DIM, VALUE_DIM = 2, 16, 8


def kda_inputs(tokens: int, seed: int, decay: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HEADS, KEY_DIM, generator=gen)
    k = torch.randn(tokens, HEADS, KEY_DIM, generator=gen)
    v = torch.randn(tokens, HEADS, VALUE_DIM, generator=gen)
    g = -decay * torch.rand(tokens, HEADS, KEY_DIM, generator=gen)
    beta = torch.rand(tokens, HEADS, generator=gen)
    return q, k, v, g, beta


def pool(seed: int) -> torch.Tensor:
    return torch.randn(5, HEADS, KEY_DIM, VALUE_DIM, generator=torch.Generator().manual_seed(seed))


def test_decode_step_matches_the_reference_and_leaves_padding_states_alone(xla):
    inputs = kda_inputs(4, seed=0)
    state_ids = torch.tensor([3, -1, 0, 4], dtype=torch.int32)
    expected_pool = pool(1)
    expected = on_reference(ops.kda_decode, *inputs, expected_pool, state_ids)
    got_pool = pool(1).to(xla)
    got = on_tpu(ops.kda_decode, *to(xla, *inputs), got_pool, state_ids.to(xla))
    assert_close(got, expected, atol=1e-5, rtol=1e-4, what="kda_decode o")
    assert bool((got[1].cpu() == 0).all())
    assert_close(got_pool, expected_pool, atol=1e-5, rtol=1e-4, what="kda_decode states")
    assert torch.equal(got_pool.cpu()[[1, 2]], pool(1)[[1, 2]])  # rows no request uses are untouched


def test_prefill_over_ragged_sequences_matches_the_reference(xla):
    # Lengths 0, 1, 2 chunks + 3 tokens, an exact chunk, and a padding sequence (id -1).
    lengths = [0, 1, 2 * CHUNK_SIZE + 3, CHUNK_SIZE, 7]
    cu_seqlens = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    state_ids = torch.tensor([2, 0, 4, 1, -1], dtype=torch.int32)
    inputs = kda_inputs(int(cu_seqlens[-1]), seed=2)
    expected_pool = pool(3)
    expected = on_reference(ops.kda_prefill, *inputs, cu_seqlens, expected_pool, state_ids)
    got_pool = pool(3).to(xla)
    got = on_tpu(ops.kda_prefill, *to(xla, *inputs), cu_seqlens.to(xla), got_pool, state_ids.to(xla))
    assert_close(got, expected, atol=1e-4, rtol=1e-3, what="kda_prefill o")
    assert_close(got_pool, expected_pool, atol=1e-4, rtol=1e-3, what="kda_prefill states")
    assert torch.equal(got_pool.cpu()[[2, 3]], pool(3)[[2, 3]])  # empty sequence and unused row untouched


def test_prefill_with_strong_decay_stays_finite_and_exact(xla):
    cu_seqlens = torch.tensor([0, 90], dtype=torch.int32)
    state_ids = torch.tensor([1], dtype=torch.int32)
    inputs = kda_inputs(90, seed=4, decay=30.0)  # e^{G} underflows within a chunk
    expected_pool = pool(5)
    expected = on_reference(ops.kda_prefill, *inputs, cu_seqlens, expected_pool, state_ids, use_qk_l2norm=False)
    got_pool = pool(5).to(xla)
    got = on_tpu(ops.kda_prefill, *to(xla, *inputs), cu_seqlens.to(xla), got_pool, state_ids.to(xla),
                 use_qk_l2norm=False)
    assert_close(got, expected, atol=1e-3, rtol=1e-3, what="kda_prefill o (strong decay)")
    assert_close(got_pool, expected_pool, atol=1e-3, rtol=1e-3, what="kda_prefill state (strong decay)")


def test_prefill_takes_a_minus_inf_gate_as_a_full_reset(xla):
    """A -inf gate (exp(g) = 0: its channel forgets, as in a decode step) gives the reference's output and state,
    not NaN from the pairwise differences."""
    cu_seqlens = torch.tensor([0, 90], dtype=torch.int32)
    state_ids = torch.tensor([1], dtype=torch.int32)
    q, k, v, g, beta = kda_inputs(90, seed=7)
    g[4, 0, :3] = float("-inf")
    g[70, 1, 5] = float("-inf")
    expected_pool = pool(8)
    expected = on_reference(ops.kda_prefill, q, k, v, g, beta, cu_seqlens, expected_pool, state_ids)
    got_pool = pool(8).to(xla)
    got = on_tpu(ops.kda_prefill, *to(xla, q, k, v, g, beta), cu_seqlens.to(xla), got_pool, state_ids.to(xla))
    assert not got.cpu().isnan().any() and not got_pool.cpu().isnan().any()
    assert_close(got, expected, atol=1e-4, rtol=1e-4, what="kda_prefill o (-inf gates)")
    assert_close(got_pool, expected_pool, atol=1e-4, rtol=1e-4, what="kda_prefill state (-inf gates)")


def test_prefill_then_decode_equals_prefill_of_the_whole_sequence(xla):
    inputs = kda_inputs(21, seed=6)
    whole_pool = pool(7).to(xla)
    whole = on_tpu(ops.kda_prefill, *to(xla, *inputs), torch.tensor([0, 21], dtype=torch.int32).to(xla),
                   whole_pool, torch.tensor([2], dtype=torch.int32).to(xla))
    split_pool = pool(7).to(xla)
    head = [x[:20].to(xla) for x in inputs]
    on_tpu(ops.kda_prefill, *head, torch.tensor([0, 20], dtype=torch.int32).to(xla), split_pool,
           torch.tensor([2], dtype=torch.int32).to(xla))
    last = [x[20:].to(xla) for x in inputs]
    step = on_tpu(ops.kda_decode, *last, split_pool, torch.tensor([2], dtype=torch.int32).to(xla))
    assert_close(step, whole[20:], atol=1e-5, rtol=1e-4, what="last token")
    assert_close(split_pool, whole_pool, atol=1e-5, rtol=1e-4, what="final state")


def test_prefill_is_one_graph_without_host_round_trips(xla):
    import dsahal

    from conftest import compile_count, execute_count, host_fallback_counters

    cu_seqlens = torch.tensor([0, 10, 10, 70], dtype=torch.int32).to(xla)
    state_ids = torch.tensor([0, 2, -1], dtype=torch.int32).to(xla)
    state_pool = pool(8).to(xla)
    with dsahal.use_backend("tpu"):
        for seed in (9, 10):  # different data, same shapes
            inputs = to(xla, *kda_inputs(70, seed=seed))
            executions, fallbacks = execute_count(), host_fallback_counters()
            out = ops.kda_prefill(*inputs, cu_seqlens, state_pool, state_ids, check=False)
            torch_xla.sync()
            assert execute_count() == executions + 1 and host_fallback_counters() == fallbacks
            if seed == 9:
                compiles = compile_count()
        assert compile_count() == compiles
    assert out.device.type == "xla"
