"""indexer_score: agreement with the reference per index-key format (exact causal/unmapped mask,
relative error on the scores; the page pool, other layers' pages included, unchanged); batch
invariance when claimed; documented errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.paged import IndexerCase
from dsahal.conformance.strategies import bind, index_format_names, indexer_cases

FORMATS = [f"index:{name}" for name in index_format_names()]
# Two requests, eight speculative query tokens, a context crossing block boundaries.
SPECULATIVE = IndexerCase(fmt=None, requests=((37, 8), (5, 2)), heads=4, q_dtype="bfloat16", block_tokens=4,
                          spare_blocks=2, hole=False, width_delta=3, regime="normal", lead=4, noncontiguous_q=True,
                          seed=7)
# Contexts at block edges (a multiple of block_tokens, one more, one less, a single token) in the
# packed cache, q a slice of a fused projection output, int64 metadata.
BLOCK_EDGES = IndexerCase(fmt=None, requests=((16, 1), (17, 2), (15, 3), (1, 1)), heads=2, q_dtype="float32",
                          block_tokens=16, spare_blocks=1, hole=False, width_delta=0, regime="normal", lead=0,
                          noncontiguous_q=False, seed=12, layout="packed", index_dtype="int64", fused_q=True)


def _call(a, rows=None):
    pick = slice(None) if rows is None else rows
    return ops.indexer_score(a.q[pick], a.weights[pick], a.index_pages, a.block_table, a.req_ids[pick],
                             a.positions[pick], index_fmt=a.index_fmt, max_context=a.max_context)


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("indexer_score", "indexer_score.matches_reference")
@given(case=indexer_cases())
@example(case=SPECULATIVE)
@example(case=BLOCK_EDGES)
def test_indexer_score_matches_reference(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    pool = a.guarded.pool.clone()
    got = conformance.call(lambda: _call(a))
    A.assert_untouched(conformance, "the page pool (a read-only op's cache)", a.guarded.pool, pool,
                       describe=a.guarded.describe)
    expected = conformance.table.reference["indexer_score"](a.q, a.weights, a.index_pages, a.block_table, a.req_ids,
                                                            a.positions, a.index_fmt, a.max_context)
    A.assert_shape_dtype(conformance, "score", got, (a.q.shape[0], a.max_context), torch.float32)
    A.assert_same_neg_inf(conformance, "score", got, expected,
                          " causal/unmapped (entry [t, s] is visible iff s <= positions[t] on a mapped block)")
    A.assert_rows_close(conformance, "score", got, expected, A.output_rtol(a.q.dtype, torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("indexer_score", "indexer_score.batch_invariant", needs=("batch_invariant",))
@given(case=indexer_cases())
@example(case=SPECULATIVE)
def test_indexer_score_rows_do_not_depend_on_the_batch(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    got = conformance.call(lambda: _call(a))
    for t in range(a.q.shape[0]):
        alone = conformance.call(lambda: _call(a, rows=slice(t, t + 1)))
        A.assert_bitwise(conformance, "score", alone[0], got[t], f"for token {t} alone vs in a batch of {got.shape[0]}")


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("indexer_score", "indexer_score.rejects_bad_input", scale=0.2)
@given(case=indexer_cases())
def test_indexer_score_rejects_bad_input(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: _call(a))
    far = a.positions.clone()
    far[0] = a.block_table.shape[1] * a.index_pages.shape[1]
    kw = dict(index_fmt=a.index_fmt, max_context=a.max_context)
    check_rejections(conformance, "indexer_score", {
        "q with 64 dims": (lambda: ops.indexer_score(a.q[..., :64], a.weights, a.index_pages, a.block_table,
                                                     a.req_ids, a.positions, **kw), ValueError),
        "weights bf16": (lambda: ops.indexer_score(a.q, a.weights.bfloat16(), a.index_pages, a.block_table,
                                                   a.req_ids, a.positions, **kw), TypeError),
        "position beyond the block table": (lambda: ops.indexer_score(a.q, a.weights, a.index_pages, a.block_table,
                                                                      a.req_ids, far, **kw), ValueError),
        "pages of another record size": (lambda: ops.indexer_score(a.q, a.weights, a.index_pages[..., 1:],
                                                                   a.block_table, a.req_ids, a.positions, **kw),
                                         ValueError),
        "unknown format": (lambda: ops.indexer_score(a.q, a.weights, a.index_pages, a.block_table, a.req_ids,
                                                     a.positions, index_fmt="no-such-format",
                                                     max_context=a.max_context), ValueError),
        "max_context 0": (lambda: ops.indexer_score(a.q, a.weights, a.index_pages, a.block_table, a.req_ids,
                                                    a.positions, index_fmt=a.index_fmt, max_context=0), ValueError),
    })
