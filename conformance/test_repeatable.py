"""Bitwise self-consistency (FlashMLA- and DeepGEMM-style): a backend whose Capabilities claim
``deterministic`` returns the same bits for the same call twice, for every op: outputs, written
cache bytes and pooled states. Each call gets its own freshly built arguments (identical by
construction), so an op that wrongly modifies its inputs cannot make the second call differ either.
The collectives all_gather and all_to_all move data exactly (their properties compare for equality),
so their repetition is already covered."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.distributed import RankPoolError, run_on_ranks
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import (all_format_ids, bind, cache_write_cases, dsa_cases, index_format_names,
                                           indexer_cases, kda_cases, latent_format_names, lse_cases, merge_cases,
                                           slots_cases, sparse_mla_cases, topk_cases)
from dsahal.conformance.test_kda import WHOLE_CHUNKS, decode_cases
from dsahal.conformance.test_lse_combine import SIXTEEN_PARTS
from dsahal.conformance.test_sparse_mla import PACKED as SPARSE_PACKED
from dsahal.conformance.test_topk import WIDE_TIES

NEEDS = ("deterministic",)
SCALE = 0.3


def _same_bits(run, results: dict) -> None:
    """``results``: name -> (first call's tensor, second call's tensor)."""
    for name, (first, second) in results.items():
        A.assert_bitwise(run, name, second, first, "when the same call is made twice")


def _twice(run, case, call):
    """``call(args)`` on two fresh builds of ``case``: ``[(args, result), (args, result)]``."""
    runs = []
    for _ in range(2):
        args = run.build(case)
        runs.append((args, run.call(lambda: call(args))))
    return runs


@pytest.mark.parametrize("fmt", all_format_ids())
@conformance_property("cache_write", "cache_write.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=cache_write_cases())
def test_cache_write_is_bitwise_repeatable(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    (a, _), (b, _) = _twice(conformance, case, lambda x: ops.cache_write(x.values, x.slots, x.pages, kind=x.kind,
                                                                         fmt=x.fmt, scale=x.scale))
    _same_bits(conformance, {"page pool after the write": (a.guarded.pool, b.guarded.pool)})


@pytest.mark.parametrize("fmt", [f"index:{n}" for n in index_format_names()])
@conformance_property("indexer_score", "indexer_score.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=indexer_cases())
def test_indexer_score_is_bitwise_repeatable(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    (_, first), (_, second) = _twice(conformance, case, lambda x: ops.indexer_score(
        x.q, x.weights, x.index_pages, x.block_table, x.req_ids, x.positions, index_fmt=x.index_fmt,
        max_context=x.max_context))
    _same_bits(conformance, {"score": (first, second)})


@conformance_property("topk", "topk.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=topk_cases())
@example(case=WIDE_TIES)
def test_topk_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    (_, first), (_, second) = _twice(conformance, case, lambda x: ops.topk(x.scores, x.lengths, x.k))
    _same_bits(conformance, {"topk (ids in their output order)": (first, second)})


@conformance_property("positions_to_slots", "positions_to_slots.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=slots_cases())
def test_positions_to_slots_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    (_, first), (_, second) = _twice(conformance, case, lambda x: ops.positions_to_slots(
        x.positions, x.req_ids, x.block_table, x.block_tokens))
    _same_bits(conformance, {"slots": (first, second)})


@pytest.mark.parametrize("fmt", [f"latent:{n}" for n in latent_format_names()])
@conformance_property("sparse_mla", "sparse_mla.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=sparse_mla_cases())
@example(case=SPARSE_PACKED)
def test_sparse_mla_is_bitwise_repeatable(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    (_, (o1, lse1)), (_, (o2, lse2)) = _twice(conformance, case, lambda x: ops.sparse_mla(
        x.q, x.kv_pages, x.slots, kv_fmt=x.kv_fmt, kv_scale=x.kv_scale, softmax_scale=x.softmax_scale))
    _same_bits(conformance, {"o": (o1, o2), "lse": (lse1, lse2)})


@conformance_property("lse_combine", "lse_combine.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=lse_cases())
@example(case=SIXTEEN_PARTS)
def test_lse_combine_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    (_, (o1, lse1)), (_, (o2, lse2)) = _twice(conformance, case, lambda x: ops.lse_combine(x.o_parts, x.lse_parts))
    _same_bits(conformance, {"o": (o1, o2), "lse": (lse1, lse2)})


@conformance_property("kda_decode", "kda_decode.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=decode_cases())
def test_kda_decode_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    (a, o1), (b, o2) = _twice(conformance, case, lambda x: ops.kda_decode(
        x.q, x.k, x.v, x.g, x.beta, x.state_pool, x.state_ids, scale=x.scale, use_qk_l2norm=x.use_qk_l2norm))
    _same_bits(conformance, {"o": (o1, o2), "state buffer after the step": (a.state_base, b.state_base)})


@conformance_property("kda_prefill", "kda_prefill.bitwise_repeatable", needs=NEEDS, scale=SCALE)
@given(case=kda_cases())
@example(case=WHOLE_CHUNKS)
def test_kda_prefill_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    (a, o1), (b, o2) = _twice(conformance, case, lambda x: ops.kda_prefill(
        x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, x.state_pool, x.state_ids, scale=x.scale,
        use_qk_l2norm=x.use_qk_l2norm))
    _same_bits(conformance, {"o": (o1, o2), "state buffer after prefill": (a.state_base, b.state_base)})


@pytest.mark.parametrize("fmt", [f"latent:{lat}+index:{idx}" for lat in latent_format_names()
                                 for idx in index_format_names()])
@conformance_property("dsa_attention", "dsa_attention.bitwise_repeatable", needs=NEEDS, scale=0.2)
@given(case=dsa_cases())
def test_dsa_attention_is_bitwise_repeatable(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    (_, (o1, lse1)), (_, (o2, lse2)) = _twice(conformance, case, lambda x: ops.dsa_attention(
        x.q_index, x.index_weights, x.index_pages, x.q, x.kv_pages, x.block_table, x.req_ids, x.positions,
        index_fmt=x.index_fmt, kv_fmt=x.kv_fmt, topk=x.topk, max_context=x.max_context,
        softmax_scale=x.softmax_scale, kv_scale=x.kv_scale))
    _same_bits(conformance, {"o": (o1, o2), "lse": (lse1, lse2)})


@conformance_property("topk_merge", "topk_merge.bitwise_repeatable", needs=NEEDS + ("distributed",), scale=0.2)
@given(case=merge_cases())
def test_topk_merge_is_bitwise_repeatable(case, conformance):
    conformance.begin(case)
    a = case.build()
    per_rank = [(a.local_scores[r], a.local_lengths[r], a.k) for r in range(case.world)]
    results = []
    for _ in range(2):
        try:
            answers = run_on_ranks(conformance.backend, "topk_merge", per_rank)
        except RankPoolError as exc:
            conformance.fail(f"the collective failed on the ranks: {exc}")
        for _, calls in answers:
            conformance.record_calls(calls)
        results.append([got for got, _ in answers])
    _same_bits(conformance, {f"rank {r}'s merge": (results[0][r], results[1][r]) for r in range(case.world)})
