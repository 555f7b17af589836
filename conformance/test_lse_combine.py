"""lse_combine: the union's (o, lse) from the parts', overflow-safe; -inf parts contribute nothing."""
from __future__ import annotations

import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.cases import LseCase
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import lse_cases

HUGE_AND_EMPTY = LseCase(parts=3, rows=3, heads=2, dim=8, dtype="float32", lse_offset=1000.0, spread=30.0,
                         neg_inf_fraction=0.3, all_inf_rows=(1,), seed=5)
# More partials than a kernel that unrolls 8 holds: DCP over 16 ranks, split-K over 8 plus one; the
# partials a strided view of a wider split-K workspace. Small spread: every part matters.
SIXTEEN_PARTS = LseCase(parts=16, rows=2, heads=2, dim=64, dtype="float32", lse_offset=5.0, spread=0.1,
                        neg_inf_fraction=0.0, all_inf_rows=(), seed=14, padded=True)
NINE_PARTS = SIXTEEN_PARTS.replace(parts=9, dtype="bfloat16", neg_inf_fraction=0.3, seed=15)


@conformance_property("lse_combine", "lse_combine.matches_reference")
@given(case=lse_cases())
@example(case=HUGE_AND_EMPTY)
@example(case=SIXTEEN_PARTS)
@example(case=NINE_PARTS)
def test_lse_combine_matches_reference(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    o, lse = conformance.call(lambda: ops.lse_combine(a.o_parts, a.lse_parts))
    ref_o, ref_lse = conformance.table.reference["lse_combine"](a.o_parts, a.lse_parts)
    A.assert_shape_dtype(conformance, "o", o, a.o_parts.shape[1:], a.o_parts.dtype)
    A.assert_shape_dtype(conformance, "lse", lse, a.lse_parts.shape[1:], torch.float32)
    A.assert_lse_close(conformance, "lse", lse, ref_lse, A.output_rtol(torch.float32))
    A.assert_rows_close(conformance, "o", o, ref_o, A.output_rtol(a.o_parts.dtype))
    empty = torch.isinf(ref_lse)
    if bool(empty.any()) and bool((o[empty] != 0).any()):
        conformance.fail("'o' must be exactly 0 where every part's lse is -inf")


@conformance_property("lse_combine", "lse_combine.batch_invariant", needs=("batch_invariant",))
@given(case=lse_cases())
def test_lse_combine_rows_do_not_depend_on_the_batch(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    o, lse = conformance.call(lambda: ops.lse_combine(a.o_parts, a.lse_parts))
    for t in range(a.o_parts.shape[1]):
        o_t, lse_t = conformance.call(lambda: ops.lse_combine(a.o_parts[:, t: t + 1], a.lse_parts[:, t: t + 1]))
        A.assert_bitwise(conformance, "o", o_t[0], o[t], f"for row {t} alone vs in a batch of {o.shape[0]}")
        A.assert_bitwise(conformance, "lse", lse_t[0], lse[t], f"for row {t} alone vs in a batch of {o.shape[0]}")


@conformance_property("lse_combine", "lse_combine.rejects_bad_input", scale=0.2)
@given(case=lse_cases())
def test_lse_combine_rejects_bad_input(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: ops.lse_combine(a.o_parts, a.lse_parts))
    check_rejections(conformance, "lse_combine", {
        "lse_parts bf16": (lambda: ops.lse_combine(a.o_parts, a.lse_parts.bfloat16()), TypeError),
        "o_parts int": (lambda: ops.lse_combine(a.o_parts.int(), a.lse_parts), TypeError),
        "lse_parts of another part count": (lambda: ops.lse_combine(a.o_parts, torch.cat([a.lse_parts,
                                                                                          a.lse_parts])), ValueError),
        "o_parts 3-d": (lambda: ops.lse_combine(a.o_parts[..., 0], a.lse_parts), ValueError),
    })
