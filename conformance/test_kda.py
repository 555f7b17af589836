"""KDA: decode and prefill agree with the reference (outputs and pooled states, spare pool rows
untouched, and in the packed cache's strided state view the other layers' floats around each state
untouched); prefill of whole chunks (16, 64, 128 tokens) leaves the reference's state and a decode
step after it agrees; chunked prefill equals the recurrent form (decode token by token); prefill
then decode equals prefill of the whole; batch invariance of decode when claimed; documented errors."""
from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.cases import KdaCase, untouched_mask
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import KDA_CHUNK_LENGTHS, kda_cases

DECODE_BATCH = KdaCase(seqlens=(1, 1, 1), heads=2, key_dim=16, value_dim=32, dtype="float32", use_qk_l2norm=True,
                       scale=None, decay="mild", padded=(False, True, False), spare_states=2, seed=9)
PREFILL_BATCH = KdaCase(seqlens=(7, 0, 70), heads=2, key_dim=32, value_dim=16, dtype="float32", use_qk_l2norm=True,
                        scale=None, decay="strong", padded=(False, False, True), spare_states=1, seed=10)
# Sequences of exactly one 64-token chunk, one 16-token chunk and two 64-token chunks, into the packed
# cache's state view, q/k/v slices of one fused projection, int64 ids.
WHOLE_CHUNKS = KdaCase(seqlens=(64, 16, 128), heads=2, key_dim=16, value_dim=32, dtype="float32", use_qk_l2norm=True,
                       scale=None, decay="mild", padded=(False, False, False), spare_states=1, seed=16,
                       index_dtype="int64", pool_layout="packed", fused=True)
PACKED_DECODE = DECODE_BATCH.replace(pool_layout="packed", fused=True, index_dtype="int64", seed=17)


def decode_cases():
    return kda_cases().map(lambda c: c.replace(seqlens=(1,) * len(c.seqlens)))


def _scale(a) -> float:
    return a.q.shape[-1] ** -0.5 if a.scale is None else float(a.scale)


def _rtol(a) -> float:
    return A.output_rtol(a.q.dtype)


def _decode(a, pool, ids, rows=slice(None)):
    return ops.kda_decode(a.q[rows], a.k[rows], a.v[rows], a.g[rows], a.beta[rows], pool, ids, scale=a.scale,
                          use_qk_l2norm=a.use_qk_l2norm)


def _compare_states(run, name, got_pool, ref_pool, rtol):
    A.assert_rows_close(run, name, got_pool, ref_pool, rtol, row_dims=2)


def _around_states(a):
    """(snapshot of the buffer around the state view, mask of what the view does not cover)."""
    return a.state_base.clone(), untouched_mask(a.state_base, a.state_pool)


def _check_around_states(run, a, snapshot):
    before, outside = snapshot
    A.assert_untouched(run, "memory around the state pool view (other layers' states, padding)", a.state_base,
                       before, mask=outside)


@conformance_property("kda_decode", "kda_decode.matches_reference")
@given(case=decode_cases())
@example(case=DECODE_BATCH)
@example(case=PACKED_DECODE)
def test_kda_decode_matches_reference(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool, ref_pool, around = a.state_pool, a.state_pool.clone(), _around_states(a)  # pool: the case's own view
    got = conformance.call(lambda: _decode(a, pool, a.state_ids))
    expected = conformance.table.reference["kda_decode"](a.q, a.k, a.v, a.g, a.beta, ref_pool, a.state_ids,
                                                         _scale(a), a.use_qk_l2norm)
    A.assert_shape_dtype(conformance, "o", got, a.v.shape, a.q.dtype)
    A.assert_rows_close(conformance, "o", got, expected, _rtol(a))
    _compare_states(conformance, "state_pool after the step", pool, ref_pool, _rtol(a))
    _check_around_states(conformance, a, around)
    padded = a.state_ids < 0
    if bool(padded.any()) and bool((got[padded] != 0).any()):
        conformance.fail("'o' must be exactly 0 for a padding request (state id -1)")


@conformance_property("kda_prefill", "kda_prefill.matches_reference", scale=0.5)
@given(case=kda_cases())
@example(case=PREFILL_BATCH)
@example(case=WHOLE_CHUNKS)
def test_kda_prefill_matches_reference(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool, ref_pool, around = a.state_pool, a.state_pool.clone(), _around_states(a)  # pool: the case's own view
    got = conformance.call(lambda: ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, pool, a.state_ids,
                                                   scale=a.scale, use_qk_l2norm=a.use_qk_l2norm))
    expected = conformance.table.reference["kda_prefill"](a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, ref_pool,
                                                          a.state_ids, _scale(a), a.use_qk_l2norm)
    A.assert_shape_dtype(conformance, "o", got, a.v.shape, a.q.dtype)
    A.assert_rows_close(conformance, "o", got, expected, _rtol(a))
    _compare_states(conformance, "state_pool after prefill", pool, ref_pool, 4 * _rtol(a))
    _check_around_states(conformance, a, around)


def whole_chunk_cases():
    """KDA cases whose every sequence is a whole number of chunks (16, 32, 64 or 128 tokens)."""
    return kda_cases().flatmap(lambda c: st.lists(KDA_CHUNK_LENGTHS, min_size=len(c.seqlens),
                                                  max_size=len(c.seqlens)).map(lambda n: c.replace(seqlens=tuple(n))))


@conformance_property("kda_prefill", "kda_prefill.whole_chunks_then_decode", scale=0.3)
@given(case=whole_chunk_cases())
@example(case=WHOLE_CHUNKS)
@example(case=WHOLE_CHUNKS.replace(seqlens=(64,), padded=(False,), pool_layout="dense", fused=False, decay="strong",
                                   index_dtype="int32", seed=18))
def test_kda_prefill_of_whole_chunks_then_a_decode_step(case, conformance):
    """A sequence ending exactly on a chunk boundary: its final state is the last chunk's (the step a
    kernel that stores the state from its tail-chunk branch only skips), and decode continues from it."""
    conformance.begin(case)
    a = conformance.build(case)
    pool, ref_pool, around = a.state_pool, a.state_pool.clone(), _around_states(a)
    reference = conformance.table.reference
    got = conformance.call(lambda: ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, pool, a.state_ids,
                                                   scale=a.scale, use_qk_l2norm=a.use_qk_l2norm))
    expected = reference["kda_prefill"](a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, ref_pool, a.state_ids, _scale(a),
                                        a.use_qk_l2norm)
    A.assert_rows_close(conformance, "o of the whole-chunk prefill", got, expected, _rtol(a))
    _compare_states(conformance, f"state_pool after prefilling {list(case.seqlens)} tokens", pool, ref_pool,
                    4 * _rtol(a))
    step = conformance.build(case.replace(seqlens=(1,) * len(case.seqlens), seed=case.seed + 1))
    o = conformance.call(lambda: _decode(step, pool, a.state_ids))
    ref_o = reference["kda_decode"](step.q, step.k, step.v, step.g, step.beta, ref_pool, a.state_ids, _scale(step),
                                    step.use_qk_l2norm)
    A.assert_rows_close(conformance, "o of the decode step after the prefill", o, ref_o, 4 * _rtol(a))
    _compare_states(conformance, "state_pool after the decode step", pool, ref_pool, 4 * _rtol(a))
    _check_around_states(conformance, a, around)


def _decode_sequence(run, a, pool, ids, start, end, seq):
    """Feed tokens ``start:end`` one decode step at a time (request ``seq``'s state in ``ids``)."""
    outputs = []
    for t in range(start, end):
        outputs.append(run.call(lambda t=t: _decode(a, pool, ids, rows=slice(t, t + 1)))[0])
    return outputs


def _with_scratch_states(a):
    """Padded sequences (id -1) start from zero in prefill; give them zeroed scratch pool rows so
    the decode form (where -1 means "no request") can run the same recurrence."""
    ids = a.state_ids.clone()
    pool = a.state_pool.clone()
    padded = (ids < 0).nonzero().flatten().tolist()
    if padded:
        scratch = torch.zeros((len(padded), *pool.shape[1:]), dtype=pool.dtype, device=pool.device)
        ids[padded] = torch.arange(pool.shape[0], pool.shape[0] + len(padded), dtype=ids.dtype, device=ids.device)
        pool = torch.cat([pool, scratch])
    return pool, ids


@conformance_property("kda_prefill", "kda.chunked_equals_recurrent", scale=0.5)
@given(case=kda_cases(max_len=12))
@example(case=PREFILL_BATCH.replace(seqlens=(7, 0, 12)))
def test_kda_chunked_prefill_equals_the_recurrent_form(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool, ids = _with_scratch_states(a)
    chunked_pool = pool.clone()
    chunked = conformance.call(lambda: ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, chunked_pool, ids,
                                                       scale=a.scale, use_qk_l2norm=a.use_qk_l2norm))
    recurrent_pool = pool.clone()
    bounds = a.cu_seqlens.tolist()
    for seq, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        steps = _decode_sequence(conformance, a, recurrent_pool, ids[seq: seq + 1], start, end, seq)
        if steps:
            A.assert_rows_close(conformance, f"o of sequence {seq} (chunked vs recurrent)", chunked[start:end],
                                torch.stack(steps), 2 * _rtol(a))
    _compare_states(conformance, "final states (chunked vs recurrent)", chunked_pool, recurrent_pool, 4 * _rtol(a))


@conformance_property("kda_prefill", "kda.prefill_then_decode_equals_whole", scale=0.5)
@given(case=kda_cases(max_len=16), cut=st.floats(0.0, 1.0))
@example(case=PREFILL_BATCH.replace(seqlens=(7, 0, 9)), cut=0.5)
def test_kda_prefill_then_decode_equals_prefill_of_the_whole(case, cut, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool, ids = _with_scratch_states(a)
    whole_pool = pool.clone()
    whole = conformance.call(lambda: ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, whole_pool, ids,
                                                     scale=a.scale, use_qk_l2norm=a.use_qk_l2norm))
    bounds = a.cu_seqlens.tolist()
    heads = [start + int(cut * (end - start)) for start, end in zip(bounds[:-1], bounds[1:])]
    prefix = torch.cat([torch.arange(s, h) for s, h in zip(bounds[:-1], heads)]).long().to(a.q.device)
    prefix_cu = torch.tensor([0, *torch.cumsum(torch.tensor([h - s for s, h in zip(bounds[:-1], heads)]), 0)],
                             dtype=torch.int32, device=a.q.device)
    split_pool = pool.clone()
    head_out = conformance.call(lambda: ops.kda_prefill(a.q[prefix], a.k[prefix], a.v[prefix], a.g[prefix],
                                                        a.beta[prefix], prefix_cu, split_pool, ids, scale=a.scale,
                                                        use_qk_l2norm=a.use_qk_l2norm))
    A.assert_rows_close(conformance, "o of the prefilled prefix", head_out, whole[prefix], 2 * _rtol(a))
    for seq, (head, end) in enumerate(zip(heads, bounds[1:])):
        steps = _decode_sequence(conformance, a, split_pool, ids[seq: seq + 1], head, end, seq)
        if steps:
            A.assert_rows_close(conformance, f"o of sequence {seq} decoded after its prefix", torch.stack(steps),
                                whole[head:end], 2 * _rtol(a))
    _compare_states(conformance, "final states (prefill + decode vs whole)", split_pool, whole_pool, 4 * _rtol(a))


@conformance_property("kda_decode", "kda_decode.batch_invariant", needs=("batch_invariant",))
@given(case=decode_cases())
@example(case=DECODE_BATCH)
def test_kda_decode_rows_do_not_depend_on_the_batch(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool = a.state_pool.clone()
    batch = conformance.call(lambda: _decode(a, pool, a.state_ids))
    for b in range(a.q.shape[0]):
        alone_pool = a.state_pool.clone()
        alone = conformance.call(lambda b=b: _decode(a, alone_pool, a.state_ids[b: b + 1], rows=slice(b, b + 1)))
        A.assert_bitwise(conformance, "o", alone[0], batch[b], f"for request {b} alone vs in a batch")
        sid = int(a.state_ids[b])
        if sid >= 0:
            A.assert_bitwise(conformance, "state", alone_pool[sid], pool[sid], f"for request {b} alone vs in a batch")


@conformance_property("kda_prefill", "kda.rejects_bad_input", scale=0.2)
@given(case=kda_cases(min_sequences=2))
def test_kda_rejects_bad_input_and_leaves_states_alone(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool = a.state_pool.clone()
    conformance.call(lambda: ops.kda_prefill(a.q, a.k, a.v, a.g, a.beta, a.cu_seqlens, pool, a.state_ids,
                                             scale=a.scale, use_qk_l2norm=a.use_qk_l2norm))
    snapshot = pool.clone()
    twice = torch.zeros_like(a.state_ids)
    bad_cu = a.cu_seqlens.clone()
    bad_cu[-1] += 1

    def prefill(**changes):
        args = dict(q=a.q, k=a.k, v=a.v, g=a.g, beta=a.beta, cu_seqlens=a.cu_seqlens, state_pool=pool,
                    state_ids=a.state_ids)
        args.update(changes)
        return lambda: ops.kda_prefill(**args, scale=a.scale, use_qk_l2norm=a.use_qk_l2norm)

    def unchanged(name):
        if not torch.equal(pool, snapshot):
            conformance.fail(f"bad input '{name}' was rejected but the state pool changed")

    check_rejections(conformance, "kda_prefill", {
        "a state id used twice": (prefill(state_ids=twice), ValueError),
        "state id beyond the pool": (prefill(state_ids=a.state_ids.clamp(min=0) + pool.shape[0]), ValueError),
        "cu_seqlens not ending at T": (prefill(cu_seqlens=bad_cu), ValueError),
        "state_pool bf16": (prefill(state_pool=pool.bfloat16()), TypeError),
        "v of another head count": (prefill(v=torch.cat([a.v, a.v], dim=1)), ValueError),
        "q int": (prefill(q=a.q.int()), TypeError),
    }, after_each=unchanged)


@conformance_property("kda_decode", "kda_decode.rejects_bad_input", scale=0.2)
@given(case=decode_cases())
def test_kda_decode_rejects_bad_input_and_leaves_states_alone(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    pool = a.state_pool.clone()
    conformance.call(lambda: _decode(a, pool, a.state_ids))
    snapshot = pool.clone()

    def decode(**changes):
        args = dict(q=a.q, k=a.k, v=a.v, g=a.g, beta=a.beta, state_pool=pool, state_ids=a.state_ids)
        args.update(changes)
        return lambda: ops.kda_decode(**args, scale=a.scale, use_qk_l2norm=a.use_qk_l2norm)

    def unchanged(name):
        if not torch.equal(pool, snapshot):
            conformance.fail(f"bad input '{name}' was rejected but the state pool changed")

    check_rejections(conformance, "kda_decode", {
        "state id below -1": (decode(state_ids=a.state_ids.clamp(max=-2)), ValueError),
        "k with another head dim": (decode(k=a.k[..., :-1].contiguous()), ValueError),
        "beta 3-d": (decode(beta=a.beta[..., None]), ValueError),
        "q with a strided last dim": (decode(q=torch.cat([a.q, a.q], dim=-1)[..., ::2]), ValueError),
        "scale 0": (lambda: ops.kda_decode(a.q, a.k, a.v, a.g, a.beta, pool, a.state_ids, scale=0.0), ValueError),
    }, after_each=unchanged)
