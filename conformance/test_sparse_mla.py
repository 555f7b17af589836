"""sparse_mla: agreement with the reference per latent format (the page pool, other layers' pages
included, unchanged); -1 slots are skipped; attention over a union equals the LSE combine of
attention over its parts; batch invariance when claimed."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.cases import generator
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.paged import SparseMlaCase
from dsahal.conformance.strategies import bind, latent_format_names, sparse_mla_cases
from dsahal.formats import LATENT_NOPE_DIM

FORMATS = [f"latent:{name}" for name in latent_format_names()]
# Padding, an empty row, duplicates, several rows of one batch with enough slots to split work.
TYPICAL = SparseMlaCase(fmt=None, rows=4, heads=4, topk=40, num_blocks=3, block_tokens=16, minus_one_fraction=0.2,
                        empty_rows=(2,), duplicates=True, q_dtype="bfloat16", softmax_scale=192 ** -0.5,
                        regime="normal", lead=8, seed=6)
# The packed cache, q a slice of a fused projection output, int64 slots; a row with a single valid
# slot (row 0: topk 1 and no -1) and an all -1 row.
PACKED_SINGLE = SparseMlaCase(fmt=None, rows=2, heads=3, topk=1, num_blocks=3, block_tokens=4, minus_one_fraction=0.0,
                              empty_rows=(1,), duplicates=False, q_dtype="float32", softmax_scale=192 ** -0.5,
                              regime="normal", lead=0, seed=13, layout="packed", index_dtype="int64", fused_q=True)
PACKED = TYPICAL.replace(layout="packed", index_dtype="int64", fused_q=True, q_dtype="float32")


def _call(a, slots=None, q=None):
    return ops.sparse_mla(a.q if q is None else q, a.kv_pages, a.slots if slots is None else slots,
                          kv_fmt=a.kv_fmt, kv_scale=a.kv_scale, softmax_scale=a.softmax_scale)


def _rtol(a) -> float:
    return A.output_rtol(a.q.dtype, torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("sparse_mla", "sparse_mla.matches_reference")
@given(case=sparse_mla_cases())
@example(case=TYPICAL)
@example(case=PACKED)
@example(case=PACKED_SINGLE)
def test_sparse_mla_matches_reference(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    pool = a.guarded.pool.clone()
    o, lse = conformance.call(lambda: _call(a))
    A.assert_untouched(conformance, "the page pool (a read-only op's cache)", a.guarded.pool, pool,
                       describe=a.guarded.describe)
    ref_o, ref_lse = conformance.table.reference["sparse_mla"](a.q, a.kv_pages, a.slots, a.kv_fmt, a.kv_scale,
                                                               a.softmax_scale)
    rows, heads = a.q.shape[:2]
    A.assert_shape_dtype(conformance, "o", o, (rows, heads, LATENT_NOPE_DIM), a.q.dtype)
    A.assert_shape_dtype(conformance, "lse", lse, (rows, heads), torch.float32)
    A.assert_lse_close(conformance, "lse", lse, ref_lse, _rtol(a))
    A.assert_rows_close(conformance, "o", o, ref_o, _rtol(a))
    empty = (a.slots < 0).all(dim=1)
    if bool(empty.any()) and bool((o[empty] != 0).any()):
        conformance.fail("'o' must be exactly 0 for a row whose slots are all -1")


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("sparse_mla", "sparse_mla.skips_minus_one")
@given(case=sparse_mla_cases(), extra=st.integers(1, 9))
@example(case=TYPICAL, extra=5)
def test_sparse_mla_ignores_interleaved_minus_one_slots(fmt, case, extra, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    gen = generator(case.seed + 1)
    width = a.slots.shape[1] + extra
    padded = torch.full((a.slots.shape[0], width), -1, dtype=a.slots.dtype, device=a.slots.device)
    for t in range(a.slots.shape[0]):  # keep the row's slots, in order, at random columns
        columns = torch.sort(torch.randperm(width, generator=gen)[: a.slots.shape[1]]).values.to(a.slots.device)
        padded[t, columns] = a.slots[t]
    o, lse = conformance.call(lambda: _call(a))
    o_padded, lse_padded = conformance.call(lambda: _call(a, slots=padded))
    A.assert_lse_close(conformance, "lse with -1 slots interleaved", lse_padded, lse, _rtol(a))
    A.assert_rows_close(conformance, "o with -1 slots interleaved", o_padded, o, _rtol(a))


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("sparse_mla", "sparse_mla.union_is_lse_combine")
@given(case=sparse_mla_cases(), parts=st.integers(2, 4))
@example(case=TYPICAL, parts=3)
def test_sparse_mla_over_a_union_is_the_lse_combine_of_its_parts(fmt, case, parts, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    owner = torch.randint(0, parts, a.slots.shape, generator=generator(case.seed + 2)).to(a.slots.device)
    partials = [conformance.call(lambda p=p: _call(a, slots=torch.where(owner == p, a.slots, -1)))
                for p in range(parts)]
    o_parts = torch.stack([o for o, _ in partials]).float()
    lse_parts = torch.stack([lse for _, lse in partials])
    o_union, lse_union = conformance.call(lambda: _call(a))
    o_comb, lse_comb = conformance.call(lambda: ops.lse_combine(o_parts, lse_parts))
    A.assert_lse_close(conformance, "lse combined from parts", lse_comb, lse_union, _rtol(a))
    A.assert_rows_close(conformance, "o combined from parts", o_comb, o_union.float(), _rtol(a))


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("sparse_mla", "sparse_mla.batch_invariant", needs=("batch_invariant",))
@given(case=sparse_mla_cases(min_rows=2))
@example(case=TYPICAL)
def test_sparse_mla_rows_do_not_depend_on_the_batch(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    o, lse = conformance.call(lambda: _call(a))
    rows = a.q.shape[0]
    for t in range(rows):
        o_t, lse_t = conformance.call(lambda: _call(a, slots=a.slots[t: t + 1], q=a.q[t: t + 1]))
        A.assert_bitwise(conformance, "o", o_t[0], o[t], f"for row {t} alone vs in a batch of {rows}")
        A.assert_bitwise(conformance, "lse", lse_t[0], lse[t], f"for row {t} alone vs in a batch of {rows}")
    flipped_o, _ = conformance.call(lambda: _call(a, slots=a.slots.flip(0), q=a.q.flip(0)))
    A.assert_bitwise(conformance, "o", flipped_o.flip(0), o, "with the batch's rows reversed")


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("sparse_mla", "sparse_mla.rejects_bad_input", scale=0.2)
@given(case=sparse_mla_cases())
def test_sparse_mla_rejects_bad_input(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: _call(a))
    num_slots = a.kv_pages.shape[0] * a.kv_pages.shape[1]
    beyond = a.slots.clone()
    beyond[0, 0] = num_slots
    kw = dict(kv_fmt=a.kv_fmt, kv_scale=a.kv_scale, softmax_scale=a.softmax_scale)
    check_rejections(conformance, "sparse_mla", {
        "slot beyond the pages": (lambda: ops.sparse_mla(a.q, a.kv_pages, beyond, **kw), ValueError),
        "slot below -1": (lambda: ops.sparse_mla(a.q, a.kv_pages, beyond.clamp(max=-2), **kw), ValueError),
        "q with 512 dims": (lambda: ops.sparse_mla(a.q[..., :512], a.kv_pages, a.slots, **kw), ValueError),
        "q int": (lambda: ops.sparse_mla(a.q.int(), a.kv_pages, a.slots, **kw), TypeError),
        "slots float": (lambda: ops.sparse_mla(a.q, a.kv_pages, a.slots.float(), **kw), TypeError),
        "pages of another record size": (lambda: ops.sparse_mla(a.q, a.kv_pages[..., 1:], a.slots, **kw), ValueError),
        "unknown format": (lambda: ops.sparse_mla(a.q, a.kv_pages, a.slots, kv_fmt="no-such-format",
                                                  kv_scale=a.kv_scale, softmax_scale=a.softmax_scale), ValueError),
        "softmax_scale 0": (lambda: ops.sparse_mla(a.q, a.kv_pages, a.slots, kv_fmt=a.kv_fmt, kv_scale=a.kv_scale,
                                                   softmax_scale=0.0), ValueError),
    })
