"""topk: a valid selection with the reference's score multiset; the exact tie-rule set when the
backend claims determinism; the same bits for a row alone, in any batch and in a wider call when it claims batch
invariance; documented errors on bad input."""
from __future__ import annotations

import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.cases import TopkCase
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import topk_cases

# Equal scores straddling the k-th place, a row exactly k long and one shorter than k.
STRADDLE = TopkCase(rows=3, width=20, k=6, lengths=(20, 6, 3), mode="straddle", neg_inf_fraction=0.0, inf_rows=(),
                    noncontiguous=False, seed=1)
PALETTE = TopkCase(rows=2, width=32, k=5, lengths=(32, 17), mode="palette", neg_inf_fraction=0.2, inf_rows=(),
                   noncontiguous=True, seed=2)
# Boundaries every run, at the kernels' tile size (1024, see strategies.TOPK_TILE): length = k and
# k +- 1, whole tiles and one entry into the next (the last tile of a row holding one entry), a single
# valid entry, an all -inf row; int64 lengths.
TILE = 1024
EDGES = TopkCase(rows=8, width=2 * TILE + 1, k=TILE, lengths=(TILE - 1, TILE, TILE + 1, 2 * TILE - 1, 2 * TILE,
                                                               2 * TILE + 1, 1, 2 * TILE + 1),
                 mode="continuous", neg_inf_fraction=0.0, inf_rows=(7,), noncontiguous=False, seed=3,
                 index_dtype="int64")
# All-equal scores over rows wider than a tile: the tie rule alone picks indices 0..k-1.
ALL_EQUAL = TopkCase(rows=3, width=2 * TILE + 37, k=TILE + 300, lengths=(2 * TILE + 37, TILE + 301, TILE + 299),
                     mode="equal", neg_inf_fraction=0.0, inf_rows=(), noncontiguous=True, seed=4)
# Ties straddling the k-th place across tiles (a four-value palette over rows of two tiles and more).
WIDE_TIES = TopkCase(rows=2, width=2 * TILE + 50, k=700, lengths=(2 * TILE + 50, TILE + 600), mode="palette",
                     neg_inf_fraction=0.0, inf_rows=(), noncontiguous=False, seed=5)

# Rows as long as a DSA layer's context (the drawn rows stay under ~2K): a GPU backend's long-row kernels (the
# nvidia backend picks its top-k by row width: a lower-bound compaction for 8K-64K, maxima over groups of entries
# from 64K) see ties straddling the k-th place, -inf entries, a row exactly one short of k, and four-value palettes
# whose k-th place is one heavily tied value.
LONG_STRADDLE = TopkCase(rows=3, width=131072, k=2048, lengths=(131072, 100003, 2047), mode="straddle",
                         neg_inf_fraction=0.2, inf_rows=(), noncontiguous=False, seed=6)
LONG_PALETTE = TopkCase(rows=3, width=20000, k=2048, lengths=(20000, 9001, 2049), mode="palette",
                        neg_inf_fraction=0.0, inf_rows=(2,), noncontiguous=True, seed=7)


def _run_topk(run, case):
    run.begin(case)
    args = run.build(case)
    got = run.call(lambda: ops.topk(args.scores, args.lengths, args.k))
    expected = run.table.reference["topk"](args.scores, args.lengths, args.k)
    return args, got, expected


@conformance_property("topk", "topk.valid_selection")
@given(case=topk_cases())
@example(case=STRADDLE)
@example(case=PALETTE)
@example(case=EDGES)
@example(case=ALL_EQUAL)
@example(case=WIDE_TIES)
@example(case=LONG_STRADDLE)
@example(case=LONG_PALETTE)
def test_topk_selects_the_reference_score_multiset(case, conformance):
    args, got, expected = _run_topk(conformance, case)
    A.assert_topk_rows(conformance, got, args.scores, args.lengths, args.k, expected, exact_set=False)


@conformance_property("topk", "topk.exact_tie_rule", needs=("deterministic",))
@given(case=topk_cases())
@example(case=STRADDLE)
@example(case=PALETTE)
@example(case=EDGES)
@example(case=ALL_EQUAL)
@example(case=WIDE_TIES)
@example(case=LONG_STRADDLE)
@example(case=LONG_PALETTE)
def test_topk_selects_the_exact_reference_set_under_the_tie_rule(case, conformance):
    args, got, expected = _run_topk(conformance, case)
    A.assert_topk_rows(conformance, got, args.scores, args.lengths, args.k, expected, exact_set=True)


# Extra columns a row is called with in the batch-invariance property: enough to cross a GPU backend's width
# thresholds (the nvidia backend picks its kernel by the call's width: 8K, 64K), as a DSA layer's score rows are as wide
# as the call's max_context whatever each row's own length.
WIDER_BY = (8192, 65536)


@conformance_property("topk", "topk.batch_invariant", needs=("batch_invariant",))
@given(case=topk_cases())
@example(case=STRADDLE)
@example(case=WIDE_TIES)
def test_topk_rows_do_not_depend_on_the_batch_or_its_width(case, conformance):
    args, got, _ = _run_topk(conformance, case)
    rows = args.scores.shape[0]
    for t in range(rows):
        row, length = args.scores[t: t + 1], args.lengths[t: t + 1]
        alone = conformance.call(lambda: ops.topk(row, length, args.k))
        A.assert_bitwise(conformance, "topk", alone[0], got[t], f"for row {t} alone vs in a batch of {rows}")
        for extra in WIDER_BY:
            # past the row's length the wider call holds the largest finite score: a kernel reading there chooses it
            filler = torch.full((1, extra), torch.finfo(row.dtype).max, dtype=row.dtype, device=row.device)
            wider = torch.cat([row, filler], dim=1)
            in_wider = conformance.call(lambda: ops.topk(wider, length, args.k))
            A.assert_bitwise(conformance, "topk", in_wider[0], got[t],
                             f"for row {t} in a call {extra} columns wider than the batch's {row.shape[1]}")
    flipped = conformance.call(lambda: ops.topk(args.scores.flip(0), args.lengths.flip(0), args.k))
    A.assert_bitwise(conformance, "topk", flipped.flip(0), got, "with the batch's rows reversed")


@conformance_property("topk", "topk.rejects_bad_input", scale=0.2)
@given(case=topk_cases())
def test_topk_rejects_bad_input(case, conformance):
    _run_topk(conformance, case)
    a = conformance.build(case)
    too_long = a.lengths.clone()
    too_long[0] = a.scores.shape[1] + 1
    check_rejections(conformance, "topk", {
        "scores float64": (lambda: ops.topk(a.scores.double(), a.lengths, a.k), TypeError),
        "scores 1-d": (lambda: ops.topk(a.scores[0], a.lengths, a.k), ValueError),
        "lengths float": (lambda: ops.topk(a.scores, a.lengths.float(), a.k), TypeError),
        "lengths of another row count": (lambda: ops.topk(a.scores, torch.cat([a.lengths, a.lengths]), a.k),
                                         ValueError),
        "length beyond the scores' width": (lambda: ops.topk(a.scores, too_long, a.k), ValueError),
        "k = 0": (lambda: ops.topk(a.scores, a.lengths, 0), ValueError),
        "k not an int": (lambda: ops.topk(a.scores, a.lengths, float(a.k)), TypeError),
    })
