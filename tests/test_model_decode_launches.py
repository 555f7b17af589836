"""The eager decode step in fewer launches (issue #16 item 4) computes what it computed before.

:mod:`legacy_decode` is the model as it was (commit 3af3bde); both models get the same weights and the same
randomly filled cache, then decode a few greedy steps (the first with padding rows, as the CUDA-graph runner
pads). With the Hadamard rotation done by butterflies and each projection by its own matmul, as before, every
step's logits and the whole cache pool after it (latents, index keys, KDA recurrent and conv states) must be
bitwise equal, on the reference backend, in float32 and bfloat16 (the KDA ops take no float64). The rotation's
one matmul and the packed projections' wider one sum in another order: with them, the steps agree within
rounding, and greedy decoding picks the same tokens.
"""
import pytest
import torch

from dsahal.bench.model_step import CHECK_CONTEXTS, decode_setup
from dsahal.config import load_config
from dsahal.engine.batch import write_slots
from dsahal.engine.cuda_graph import DecodeInputs, pad_decode_inputs
from dsahal.formats.numerics import FP8_MAX, pow2_scale_at_least
from dsahal.bench.measure import relative_error
from dsahal.model import mla_layer, packed
from dsahal.model.indexer import fp8_pow2_scale, hadamard_butterfly, hadamard_rotate
from dsahal.registry import use_backend
from legacy_decode import dsa_attention as legacy_attention
from legacy_decode import model as legacy_model

STEPS = 3
BLOCK_TOKENS = 64


def legacy_twin(setup):
    """The pre-change model with ``setup.model``'s weights."""
    config = setup.model.config
    model = legacy_model.HybridModel(config, attention=legacy_attention.LocalDsaAttention(check=True))
    model.load_state_dict(setup.model.state_dict())
    return model.to(next(setup.model.parameters()).dtype).eval()


def step(model, inputs: DecodeInputs, block_table, setup):
    return model.step(inputs.token_ids, inputs.positions, inputs.req_ids, block_table, inputs.slots,
                      inputs.cu_seqlens, inputs.state_ids, setup.views, max_context=setup.max_context, decode=True)


def run_both(dtype, compare):
    """STEPS greedy decode steps of the pre-change and the current model from the same pool each step;
    ``compare(n, got, want, pool, want_pool)`` after each (the current model's pool and tokens carry on)."""
    setup = decode_setup(load_config("tiny"), CHECK_CONTEXTS, "cpu", dtype=dtype, check=True)
    old = legacy_twin(setup)
    pool, rows = setup.cache.pool, len(CHECK_CONTEXTS)
    padded_table = torch.cat([setup.block_table, torch.full_like(setup.block_table[:1], -1)])
    inputs = setup.inputs
    with use_backend("reference"):
        for n in range(STEPS):
            batch = pad_decode_inputs(inputs, 8, padding_row=rows) if n == 0 else inputs
            before = pool.clone()
            want = step(old, batch, padded_table, setup)
            want_pool = pool.clone()
            pool.copy_(before)
            got = step(setup.model, batch, padded_table, setup)
            assert bool((pool != before).any()), "the step wrote nothing (the comparison would be vacuous)"
            compare(n, got, want, pool, want_pool)
            tokens = got[:rows].argmax(dim=-1)
            positions = inputs.positions + 1
            slots = write_slots(setup.block_table.cpu(), inputs.req_ids.cpu(), positions.cpu(), BLOCK_TOKENS)
            inputs = DecodeInputs(tokens, positions, inputs.req_ids, slots, inputs.cu_seqlens, inputs.state_ids,
                                  rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_decode_steps_equal_the_pre_change_model_bitwise(dtype, monkeypatch):
    monkeypatch.setattr(mla_layer, "hadamard_rotate", hadamard_butterfly)
    monkeypatch.setattr(packed, "packed_weight", lambda linears: None)  # each projection its own matmul

    def compare(n, got, want, pool, want_pool):
        assert torch.equal(got, want), f"step {n}: logits differ by {(got - want).abs().max():.3e}"
        assert torch.equal(pool, want_pool), f"step {n}: the cache pool differs in " \
            f"{int((pool != want_pool).any(dim=1).sum())} rows"

    run_both(dtype, compare)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
@torch.no_grad()
def test_decode_steps_with_the_fused_matmuls_stay_within_rounding(dtype, tol):
    errors = []

    def compare(n, got, want, pool, want_pool):
        errors.append(relative_error(got, want))
        assert torch.equal(got[:len(CHECK_CONTEXTS)].argmax(-1), want[:len(CHECK_CONTEXTS)].argmax(-1)), n

    run_both(dtype, compare)
    assert max(errors) < tol, errors


def test_the_hadamard_matmul_is_the_butterflies_up_to_rounding():
    x = torch.randn(64, 33, 128, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(hadamard_rotate(x), hadamard_butterfly(x), rtol=0, atol=1e-5)
    assert torch.equal(hadamard_rotate(x.double()), hadamard_butterfly(x.double()))  # ±1 sums exact in fp64 here


def test_the_fp8_query_scale_equals_the_formats_power_of_two_scale():
    """fp8_pow2_scale (8 launches) against pow2_scale_at_least (~30) on every regime: tiny, huge, exact powers
    of two times 448 and their neighbours, the floor."""
    gen = torch.Generator().manual_seed(0)
    exponents = torch.randint(-13, 120, (20000,), generator=gen)
    spread = torch.rand(20000, generator=gen) * torch.pow(2.0, exponents.float())
    edges = torch.ldexp(torch.full((130,), FP8_MAX), torch.arange(-20, 110))
    around = torch.cat([edges, torch.nextafter(edges, torch.full_like(edges, float("inf"))),
                        torch.nextafter(edges, torch.zeros_like(edges))])
    amax = torch.cat([spread, around, torch.tensor([1e-4, 3.0e38])]).clamp_min(1e-4)
    want = pow2_scale_at_least(amax, FP8_MAX, min_exp=-126, max_exp=127)
    assert torch.equal(fp8_pow2_scale(amax), want)
