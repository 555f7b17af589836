"""DeepSeek-V3 MoE: sigmoid scores, bias-corrected top-k, group-limited routing, shared experts — against a
naive per-token loop in float64; the config fields, and which layers are MoE."""
import dataclasses
import math

import pytest
import torch

from dsahal.config import load_config
from dsahal.model import HybridModel, init_weights
from dsahal.model.layers import SwiGLU
from dsahal.model.moe import MoE
from test_model_helpers import full_sequence_logits, random_prompts, small_config


def moe_config(**overrides):
    fields = dict(hidden_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3,
                  moe_intermediate_size=16, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                  first_k_dense_replace=1)
    return small_config(**(fields | overrides))


def random_moe(config, seed=0, bias_scale=0.5):
    torch.manual_seed(seed)
    moe = MoE(config).double()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.router.e_score_correction_bias.normal_(0, bias_scale)
    return moe


def silu(v):
    return v / (1 + math.exp(-v))


def naive_expert(mlp: SwiGLU, x):
    """One token through a SwiGLU, element by element (lists of Python floats)."""
    gate, up, down = (m.weight.tolist() for m in (mlp.gate, mlp.up, mlp.down))
    h = [silu(sum(w * v for w, v in zip(g, x))) * sum(w * v for w, v in zip(u, x)) for g, u in zip(gate, up)]
    return [sum(w * v for w, v in zip(row, h)) for row in down]


def naive_route(moe: MoE, config, x):
    """(chosen experts, their weights) for one token, spelled out as DeepSeek-V3 describes the routing."""
    weight, bias = moe.router.weight.tolist(), moe.router.e_score_correction_bias.tolist()
    scores = [1 / (1 + math.exp(-sum(w * v for w, v in zip(row, x)))) for row in weight]
    biased = [s + b for s, b in zip(scores, bias)]
    size = config.n_routed_experts // config.n_group
    groups = [list(range(g * size, (g + 1) * size)) for g in range(config.n_group)]
    group_score = [sum(sorted((biased[e] for e in group), reverse=True)[:2]) for group in groups]
    kept = sorted(range(config.n_group), key=lambda g: -group_score[g])[:config.topk_group]
    candidates = [e for g in kept for e in groups[g]]
    chosen = sorted(candidates, key=lambda e: -biased[e])[:config.num_experts_per_tok]
    total = sum(scores[e] for e in chosen)
    return chosen, [scores[e] / total * config.routed_scaling_factor for e in chosen]


def naive_moe(moe: MoE, config, x):
    chosen, weights = naive_route(moe, config, x)
    out = [0.0] * len(x)
    for expert, w in zip(chosen, weights):
        out = [o + w * y for o, y in zip(out, naive_expert(moe.experts[expert], x))]
    if moe.shared is not None:
        out = [o + y for o, y in zip(out, naive_expert(moe.shared, x))]
    return out, chosen


@pytest.mark.parametrize("overrides", [{}, {"n_group": 1, "topk_group": 1}, {"n_shared_experts": 0},
                                       {"n_group": 8, "topk_group": 3, "num_experts_per_tok": 2}])
def test_moe_matches_a_naive_per_token_loop_in_float64(overrides):
    config = moe_config(**overrides)
    moe = random_moe(config)
    x = torch.randn(12, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = [naive_moe(moe, config, row.tolist())[0] for row in x]
    torch.testing.assert_close(moe(x, dense=False), torch.tensor(expected, dtype=torch.float64), rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(moe(x, dense=True), torch.tensor(expected, dtype=torch.float64), rtol=1e-12,
                               atol=1e-12)


def test_the_bias_changes_the_choice_but_not_the_weights_formula():
    """The bias moves tokens to other experts (so the test above sees it), while the weights of one set of
    chosen experts come from the unbiased scores: shifting every bias by a constant changes nothing."""
    config = moe_config()
    moe = random_moe(config, bias_scale=1.0)
    x = torch.randn(32, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    weights, chosen = moe.router(x)
    unbiased = random_moe(config, bias_scale=1.0)
    with torch.no_grad():
        unbiased.load_state_dict(moe.state_dict())
        unbiased.router.e_score_correction_bias.zero_()
    assert not torch.equal(unbiased.router(x)[1].sort(dim=1).values, chosen.sort(dim=1).values)
    with torch.no_grad():
        unbiased.router.e_score_correction_bias.copy_(moe.router.e_score_correction_bias + 3.0)
    shifted_weights, shifted_chosen = unbiased.router(x)
    assert torch.equal(shifted_chosen, chosen) and torch.equal(shifted_weights, weights)
    torch.testing.assert_close(weights.sum(dim=1), torch.full((32,), 2.5, dtype=torch.float64))


def test_group_limited_routing_chooses_within_the_kept_groups_only():
    config = moe_config(n_routed_experts=16, n_group=8, topk_group=2, num_experts_per_tok=4)
    moe = random_moe(config)
    x = torch.randn(64, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, chosen = moe.router(x)
    assert int((chosen // 2).unique(dim=None).numel()) > 2  # over all tokens, many groups are used
    for row in chosen.tolist():
        assert len({e // 2 for e in row}) <= 2
    ungrouped = random_moe(dataclasses.replace(config, n_group=1, topk_group=1))
    ungrouped.load_state_dict(moe.state_dict())
    assert not torch.equal(ungrouped.router(x)[1], chosen)  # the group limit changed some choices


def test_layers_choose_dense_or_moe_by_index_and_presets_stay_dense():
    model = HybridModel(moe_config())
    assert [type(b.mlp).__name__ for b in model.blocks] == ["SwiGLU", "MoE", "MoE", "MoE"]
    for name in ("tiny", "k31-pro-slice"):
        assert load_config(name).moe_layers == []
    assert all(isinstance(b.mlp, SwiGLU) for b in HybridModel(small_config()).blocks)


def test_a_moe_model_runs_and_its_seeded_weights_are_drawn():
    config = moe_config(hidden_size=64)
    model = init_weights(HybridModel(config), seed=0).eval()
    assert torch.equal(model.blocks[1].mlp.router.e_score_correction_bias, torch.zeros(8))
    assert model.blocks[1].mlp.experts[0].down.weight.std() < model.blocks[1].mlp.experts[0].gate.weight.std()
    logits = full_sequence_logits(model, random_prompts([20], config.vocab_size)[0])
    assert logits.shape == (20, config.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.parametrize("overrides,fragment", [
    ({"num_experts_per_tok": 0}, "num_experts_per_tok expected between 1 and n_routed_experts (8), got 0"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size expected > 0"),
    ({"n_group": 3}, "n_group expected >= 1 and dividing n_routed_experts (8), got 3"),
    ({"topk_group": 5}, "topk_group expected between 1 and n_group (4), got 5"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok expected <= topk_group x experts per group (2 x 2"),
    ({"routed_scaling_factor": 0.0}, "routed_scaling_factor expected > 0"),
])
def test_inconsistent_moe_fields_are_named(overrides, fragment):
    with pytest.raises(ValueError) as info:
        moe_config(**overrides)
    assert fragment in str(info.value)


@pytest.mark.parametrize("tokens,elements", [(12, 1 << 25), (12, 16 * 32)])  # one chunk; chunks of one expert
@torch.no_grad()
def test_batched_experts_equal_the_per_expert_loop(tokens, elements, monkeypatch):
    """Eager small batches (grad off) run the experts as batched matmuls over packed weights, in chunks of
    experts: the same as the per-expert loop (dense and sparse) to float64 rounding."""
    from dsahal.model import moe as moe_module

    monkeypatch.setattr(moe_module, "BATCH_ELEMENTS", elements)
    config = moe_config()
    moe = random_moe(config)
    x = torch.randn(tokens, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    calls = []
    monkeypatch.setattr(MoE, "_batched_experts", staticmethod(
        lambda *args, _f=MoE._batched_experts: calls.append(1) or _f(*args)))
    batched = moe(x)  # dense by default at this size, batched once the weights pack
    assert calls, "the batched path did not run"
    assert len({e.gate.weight.untyped_storage().data_ptr() for e in moe.experts}) == 1  # packed in one buffer
    expected = [naive_moe(moe, config, row.tolist())[0] for row in x]
    torch.testing.assert_close(batched, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(batched, moe(x, dense=False), rtol=1e-12, atol=1e-12)
