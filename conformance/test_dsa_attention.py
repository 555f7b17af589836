"""dsa_attention: one layer (indexer -> top-k -> slots -> sparse MLA) agrees with the composition of
the reference ops, per (latent, index) format pair, and gives a token the same bits alone and in any batch when the
backend claims batch invariance. Rows whose k-th place is tied or nearly tied
in the reference scores are excluded from the output comparison unless the backend claims
determinism: a valid selection there may differ from the reference's, and so may the output. "Nearly" is
measured against the scores' own rounding scale: a score is a sum of signed head terms ``w_h relu(q_h . k)``, so an
indexer within tolerance may be off by a fraction of the terms' magnitudes ``sum_h |w_h| relu(q_h . k)``, which can be
far larger than the score itself where the terms cancel."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.paged import DsaCase
from dsahal.conformance.strategies import bind, dsa_cases, index_format_names, latent_format_names
from dsahal.formats import LATENT_NOPE_DIM

FORMATS = [f"latent:{lat}+index:{idx}" for lat in latent_format_names() for idx in index_format_names()]
# (the indexer's tolerance for bf16 queries, A.output_rtol): the k-th and (k+1)-th scores are nearly tied when they
# differ by at most this fraction of the larger of their terms' magnitudes (thirty-ninth session: a draw whose 4th and
# 5th scores, 0.1774 and 0.1736, were a cancelling sum of terms of magnitude 12.9 swapped on a GPU indexer off by
# 4.2e-3 there, 3.3e-4 of the magnitude)
NEAR_TIE_RTOL = 2.0**-6
# Contexts of topk - 1, topk and topk + 1 tokens on block edges, index and latent pages of one layer of
# the packed cache.
EDGES = DsaCase(latent_fmt=None, index_fmt=None, requests=((16, 1), (17, 2), (15, 1)), index_heads=4, heads=4,
                topk=16, block_tokens=16, q_dtype="float32", seed=21, layout="packed")


def _reference(ref, a):
    scores = ref["indexer_score"](a.q_index, a.index_weights, a.index_pages, a.block_table, a.req_ids, a.positions,
                                  a.index_fmt, a.max_context)
    lengths = torch.clamp(a.positions + 1, max=a.max_context).to(torch.int32)
    # the scores' terms' magnitudes (every head weight made positive: sum_h |w_h| relu(q_h . k), the scale of the
    # score's rounding)
    magnitudes = ref["indexer_score"](a.q_index, a.index_weights.abs(), a.index_pages, a.block_table, a.req_ids,
                                      a.positions, a.index_fmt, a.max_context)
    chosen = ref["topk"](scores, lengths, a.topk)
    slots = ref["positions_to_slots"](chosen, a.req_ids, a.block_table, a.index_pages.shape[1])
    o, lse = ref["sparse_mla"](a.q, a.kv_pages, slots, a.kv_fmt, a.kv_scale, a.softmax_scale)
    return scores, magnitudes, lengths, o, lse


def _layer(a, rows=slice(None), flip=False):
    """``ops.dsa_attention`` of case ``a``'s tokens ``rows`` (reversed with ``flip``)."""
    def pick(x):
        x = x[rows]
        return x.flip(0) if flip else x

    return ops.dsa_attention(pick(a.q_index), pick(a.index_weights), a.index_pages, pick(a.q), a.kv_pages,
                             a.block_table, pick(a.req_ids), pick(a.positions), index_fmt=a.index_fmt,
                             kv_fmt=a.kv_fmt, topk=a.topk, max_context=a.max_context,
                             softmax_scale=a.softmax_scale, kv_scale=a.kv_scale)


def ambiguous_rows(scores: torch.Tensor, magnitudes: torch.Tensor, lengths: torch.Tensor, k: int,
                   exact_ties_too: bool) -> torch.Tensor:
    """Rows whose k-th and (k+1)-th best finite scores are equal or nearly so: within ``NEAR_TIE_RTOL`` of the larger
    of their terms' ``magnitudes`` (both ``[T, context]``, the reference's; a CPU bool mask)."""
    scores, magnitudes, lengths = scores.cpu(), magnitudes.cpu(), lengths.cpu()
    rows = torch.zeros(scores.shape[0], dtype=torch.bool)
    for t in range(scores.shape[0]):
        row, mag = scores[t, : int(lengths[t])], magnitudes[t, : int(lengths[t])]
        finite = torch.isfinite(row)
        row, mag = row[finite], mag[finite]
        if row.numel() > k:
            order = torch.sort(row, descending=True).indices
            kth, next_ = order[k - 1], order[k]
            gap = float(row[kth] - row[next_])
            scale = max(float(mag[kth]), float(mag[next_]), abs(float(row[kth])), 1e-6)
            rows[t] = gap <= NEAR_TIE_RTOL * scale and (exact_ties_too or gap > 0)
    return rows


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("dsa_attention", "dsa_attention.matches_reference_composition", scale=0.3)
@given(case=dsa_cases())
@example(case=EDGES)
def test_dsa_attention_matches_the_composition_of_reference_ops(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    o, lse = conformance.call(lambda: _layer(a))
    scores, magnitudes, lengths, ref_o, ref_lse = _reference(conformance.table.reference, a)
    A.assert_shape_dtype(conformance, "o", o, (a.q.shape[0], a.q.shape[1], LATENT_NOPE_DIM), a.q.dtype)
    A.assert_shape_dtype(conformance, "lse", lse, a.q.shape[:2], torch.float32)
    keep = ~ambiguous_rows(scores, magnitudes, lengths, a.topk,
                           exact_ties_too=not conformance.capabilities.deterministic)
    keep = keep.to(o.device)
    rtol = A.output_rtol(a.q.dtype, torch.bfloat16)
    A.assert_lse_close(conformance, "lse", lse[keep], ref_lse[keep], rtol)
    A.assert_rows_close(conformance, "o", o[keep], ref_o[keep], rtol)


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("dsa_attention", "dsa_attention.batch_invariant", needs=("batch_invariant",), scale=0.3)
@given(case=dsa_cases())
@example(case=EDGES)
def test_dsa_attention_tokens_do_not_depend_on_the_batch(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    o, lse = conformance.call(lambda: _layer(a))
    tokens = o.shape[0]
    for t in range(tokens):
        o_t, lse_t = conformance.call(lambda: _layer(a, rows=slice(t, t + 1)))
        A.assert_bitwise(conformance, "o", o_t[0], o[t], f"for token {t} alone vs in a batch of {tokens}")
        A.assert_bitwise(conformance, "lse", lse_t[0], lse[t], f"for token {t} alone vs in a batch of {tokens}")
    flipped_o, flipped_lse = conformance.call(lambda: _layer(a, flip=True))
    A.assert_bitwise(conformance, "o", flipped_o.flip(0), o, "with the batch's tokens reversed")
    A.assert_bitwise(conformance, "lse", flipped_lse.flip(0), lse, "with the batch's tokens reversed")


@pytest.mark.parametrize("fmt", FORMATS[:1])
@conformance_property("dsa_attention", "dsa_attention.rejects_bad_input", scale=0.2)
@given(case=dsa_cases())
def test_dsa_attention_rejects_bad_input(fmt, case, conformance):
    from dsahal.conformance.badinput import check_rejections

    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)

    def call(**changes):
        args = dict(q_index=a.q_index, index_weights=a.index_weights, index_pages=a.index_pages, q=a.q,
                    kv_pages=a.kv_pages, block_table=a.block_table, req_ids=a.req_ids, positions=a.positions,
                    index_fmt=a.index_fmt, kv_fmt=a.kv_fmt, topk=a.topk, max_context=a.max_context,
                    softmax_scale=a.softmax_scale, kv_scale=a.kv_scale)
        args.update(changes)
        return lambda: ops.dsa_attention(**args)

    conformance.call(call())
    check_rejections(conformance, "dsa_attention", {
        "kv_pages with other blocks than index_pages": (call(kv_pages=a.kv_pages[:0]), ValueError),
        "topk = 0": (call(topk=0), ValueError),
        "q of another token count": (call(q=torch.cat([a.q, a.q])), ValueError),
    })
