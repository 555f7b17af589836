"""The conformance suite's sharper teeth (issue 22): each ``tests/mutants/teeth_*.py`` backend is wrong
only on inputs the suite did not draw before (the packed cache's page and state views, q sliced from
a fused projection, int64 slots, more than 8 partials, merges at W = 8, whole-chunk KDA prefills,
rows of ties wider than a kernel tile, a row's last partial tile, a reduction order that changes
per call); the suite now fails each, naming the broken property, and the reference still passes
those properties.

The first tests pin down *why* the old suite missed them: on every layout it drew, each mutant's
view of its inputs is exactly the real one. The suite runs below use one drawn example per
property: the explicit boundary examples, which run every time, are what kill the mutants.
"""
from __future__ import annotations

import importlib
import sys

import pytest
import torch

from test_conformance_mutants import MUTANTS_DIR, run_suite

if str(MUTANTS_DIR) not in sys.path:  # the mutants' helper modules, imported here by name
    sys.path.insert(0, str(MUTANTS_DIR))

# mutant module -> (op family, the property that must fail, its test function)
TEETH = {
    "teeth_packed_pages": ("sparse_mla", "sparse_mla.matches_reference", "test_sparse_mla_matches_reference"),
    "teeth_packed_cache_write": ("cache_write", "cache_write.no_write_outside_slots",
                                 "test_cache_write_touches_nothing_outside_its_target_slots"),
    "teeth_kda_contiguous_pool": ("kda_decode", "kda_decode.matches_reference", "test_kda_decode_matches_reference"),
    "teeth_fused_q": ("sparse_mla", "sparse_mla.matches_reference", "test_sparse_mla_matches_reference"),
    "teeth_int64_slots": ("sparse_mla", "sparse_mla.matches_reference", "test_sparse_mla_matches_reference"),
    "teeth_lse_eight_parts": ("lse_combine", "lse_combine.matches_reference", "test_lse_combine_matches_reference"),
    "teeth_lse_nondeterministic": ("lse_combine", "lse_combine.bitwise_repeatable",
                                   "test_lse_combine_is_bitwise_repeatable"),
    "teeth_kda_chunk_state": ("kda_prefill", "kda_prefill.matches_reference", "test_kda_prefill_matches_reference"),
    "teeth_topk_tile_ties": ("topk", "topk.exact_tie_rule",
                             "test_topk_selects_the_exact_reference_set_under_the_tie_rule"),
    "teeth_topk_last_tile": ("topk", "topk.valid_selection", "test_topk_selects_the_reference_score_multiset"),
    "teeth_merge_resend_cap": ("topk_merge", "topk_merge.equals_single_device_w8",
                               "test_topk_merge_at_eight_ranks_equals_single_device_topk"),
}
EXAMPLES = "1"


def test_every_teeth_mutant_is_listed_with_its_broken_property():
    modules = {p.stem for p in MUTANTS_DIR.glob("teeth_*.py")}
    assert modules == set(TEETH)
    for name, (_, prop, _) in TEETH.items():
        assert importlib.import_module(name).BROKEN_PROPERTY == prop


# -- why the old suite missed them: each mutant is exact on the layouts it drew ----------------------

def test_the_contiguity_assumptions_hold_on_the_old_layouts_and_fail_on_the_packed_cache():
    from strided_views import as_if_contiguous, int64_read_as_int32, pages_as_flat_slots

    from dsahal.conformance.cases import fused_slice, generator, packed_state_pool
    from dsahal.conformance.paged import case_pages

    gen = generator(0)
    records = case_pages("records", "latent", "bf16", 3, 4, 5, 7, 1, gen).pages
    assert pages_as_flat_slots(records).stride() == records.stride()  # padded records: blocks back to back
    packed = case_pages("packed", "latent", "bf16", 3, 4, 0, 0, 0, gen).pages
    assert pages_as_flat_slots(packed).stride() != packed.stride()
    dense = torch.randn(3, 2, 4, 8)
    assert as_if_contiguous(dense).stride() == dense.stride()
    view, _ = packed_state_pool(dense, gen)
    assert torch.equal(view, dense) and not torch.equal(as_if_contiguous(view), dense)
    q = torch.randn(3, 2, 576)
    assert not torch.equal(as_if_contiguous(fused_slice(q, gen, 128, 64)), q)
    slots = torch.tensor([[3, -1, 7]])
    assert torch.equal(int64_read_as_int32(slots.int()), slots.int())
    assert not torch.equal(int64_read_as_int32(slots), slots.int())


def test_the_tiled_topk_mutants_are_exact_on_rows_of_one_tile():
    from tiled_topk import TILE, tiled_topk

    from dsahal.reference.topk import topk

    scores = torch.randint(0, 3, (4, TILE), generator=torch.Generator().manual_seed(1)).float()
    lengths = torch.tensor([TILE, TILE - 1, 5, 0])
    expected = topk(scores, lengths, 300)
    for bug in ({}, {"ties_last_tile_first": True}, {"drop_last_partial_tile": True}):
        got = tiled_topk(scores, lengths, 300, **bug)
        assert all(set(got[t].tolist()) == set(expected[t].tolist()) for t in range(4)), bug


def test_the_capped_resend_equals_the_real_plan_up_to_four_ranks_only():
    from teeth_merge_resend_cap import capped_plan

    from dsahal.distributed.merge import plan_merge

    for k in range(1, 65):
        for width in (1, k, k + 1, 8 * k + 8):
            for world in (2, 4):
                assert capped_plan(k, width, world) == plan_merge(k, width, world), (k, width, world)
    assert capped_plan(24, 25, 8).ranked < plan_merge(24, 25, 8).ranked


def test_the_packed_state_view_has_the_packed_caches_geometry():
    """:func:`packed_state_pool` places states as :meth:`PackedKVCache.kda_states` does (K = V here,
    as in the cache): same strides in fp32 units and the same start of layer 1 within a slot."""
    from dsahal.cache import PackedKVCache, plan_layout
    from dsahal.conformance.cases import STATE_ROW_BYTES, generator, packed_state_pool
    from dsahal.config import ModelConfig

    heads, dim = 2, 16
    config = ModelConfig(name="geometry", layer_kinds=("dsa", "kda", "kda", "kda"), vocab_size=1, hidden_size=1,
                         intermediate_size=1, num_heads=heads, q_lora_rank=1, kda_head_dim=dim)
    layout = plan_layout(config, block_tokens=3, row_rounding="page")
    assert layout.row_bytes == STATE_ROW_BYTES  # 3 x (1152 + 132) bytes, pages 256-aligned
    cache = PackedKVCache(layout, 12)
    real = cache.kda_states(2)  # the middle KDA layer
    view, _ = packed_state_pool(torch.zeros(real.shape[0], heads, dim, dim), generator(0))
    assert view.stride() == real.stride()
    assert view.storage_offset() == real.storage_offset()


def test_packed_pages_are_a_packed_cache_layer_view_and_the_mask_covers_their_records():
    from dsahal.conformance.cases import generator
    from dsahal.conformance.paged import case_pages

    guarded = case_pages("packed", "index", "fp8", 3, 4, 0, 0, 0, generator(2))
    pages, pool = guarded.pages, guarded.pool
    assert pages.stride(0) == pool.shape[1] and pages.stride(1) == pages.shape[2]
    mask = guarded.record_mask(torch.tensor([0, 5, -1, 11]))
    assert int(mask.sum()) == 3 * pages.shape[2]
    assert guarded.describe(tuple(int(i) for i in mask.nonzero()[0])) == "slot 0"
    assert guarded.describe((0, 0)).startswith("guard row")
    assert guarded.describe((2, pool.shape[1] - 1)).startswith("another layer's page or row padding")


# -- the suite kills each, and the reference passes the same properties -----------------------------

@pytest.mark.slow  # one suite process per mutant
@pytest.mark.parametrize("mutant", sorted(TEETH))
def test_the_suite_fails_the_teeth_mutant_naming_the_broken_property(mutant, tmp_path):
    family, prop, test_name = TEETH[mutant]
    proc, report = run_suite(tmp_path, mutant, "--ops", family, "-k", test_name, "--max-examples", EXAMPLES,
                             plugin=mutant)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    failed = {t["property"] for t in report["tests"] if t["outcome"] == "fail"}
    assert prop in failed, f"{mutant} survived {prop}; failed: {failed}\n{output[-3000:]}"
    assert f"backend {mutant!r} violates {prop}" in output


@pytest.mark.slow
def test_the_reference_passes_every_property_that_kills_a_teeth_mutant(tmp_path):
    families = sorted({family for family, _, _ in TEETH.values()})
    selection = " or ".join(sorted({test for _, _, test in TEETH.values()}))
    proc, report = run_suite(tmp_path, "reference", "--ops", *families, "-k", selection, "--max-examples", "2")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    passed = {t["property"] for t in report["tests"] if t["outcome"] == "pass"}
    assert {prop for _, prop, _ in TEETH.values()} <= passed, output[-3000:]
