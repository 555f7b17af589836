"""The nvidia KDA prefill route around fla's ``chunk_kda`` (``backends/nvidia/kda_fla.py``) on the CPU.

fla's own kernels do not run under the Triton interpreter (its chunk kernels fail there), and its
numerics are checked on the H200 (``scripts/h200/kda_prefill_check.py``, the conformance suite). What
is checked here is everything the route adds: fla is replaced by a fake that records what it was given
and computes the float64 recurrence, so the tests see that q/k/v/g go in without a copy or a dtype
change (same storage, strides and dtype), the pool rows come in and go back through the two state
kernels (``kda_state_rows``, run under ``TRITON_INTERPRET=1`` in a subprocess) on a strided pool with
guard rows, padding ids and empty sequences, and that the output is fla's own tensor.
"""
from __future__ import annotations

import json

import pytest
import torch

from interpreter_child import child_results, run_groups

HEADS, DIM = 2, 16
PASSED = ("initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "cu_seqlens", "cu_seqlens_cpu", "scale")


class RecordingChunkKda:
    """Stands in for ``fla.ops.kda.chunk_kda``: records its arguments, returns the float64 recurrence
    (o in q's dtype, final states fp32) as fla does."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 cu_seqlens, cu_seqlens_cpu, **rest):
        from dsahal.reference.kda import kda_recurrent_sequence

        kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                      cu_seqlens_cpu=cu_seqlens_cpu, **rest)

        self.calls.append(dict(q=q, k=k, v=v, g=g, beta=beta, initial=kwargs["initial_state"].clone(), **kwargs))
        bounds = kwargs["cu_seqlens_cpu"].tolist()
        o = torch.zeros(v.shape, dtype=q.dtype)
        finals = []
        for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            state, out = kda_recurrent_sequence(q[0, start:end], k[0, start:end], v[0, start:end], g[0, start:end],
                                                beta[0, start:end], kwargs["initial_state"][n], kwargs["scale"],
                                                kwargs["use_qk_l2norm_in_kernel"])
            o[0, start:end] = out.to(q.dtype)
            finals.append(state.float())
        self.calls[-1]["o"] = o
        return o, torch.stack(finals)


def _inputs(lengths, dtype, gate_dtype, beta_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, HEADS, DIM, generator=gen).to(dtype) for _ in range(3))
    g = (-0.5 * torch.rand(tokens, HEADS, DIM, generator=gen)).to(gate_dtype)
    beta = torch.rand(tokens, HEADS, generator=gen).to(beta_dtype)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    return q, k, v, g, beta, cu


def _strided_pool(rows, seed):
    """``[rows, H, K, V]`` pool as every third row of a larger buffer (a layer's rows in a packed cache):
    the buffer's other rows are guards that no call may touch."""
    gen = torch.Generator().manual_seed(seed)
    buffer = torch.randn(3 * rows + 1, HEADS, DIM, DIM, generator=gen) * 0.1
    return buffer, buffer[1::3]


def _state_row_cases(results):
    from dsahal.backends.nvidia.kda_state_rows import gather_states, scatter_states

    buffer, pool = _strided_pool(6, 1)
    ids = torch.tensor([3, -1, 0, 5], dtype=torch.int32)
    before = buffer.clone()
    got = gather_states(pool, ids)
    want = torch.stack([pool[3], torch.zeros_like(pool[0]), pool[0], pool[5]])
    results["gather_rows"] = torch.equal(got, want) and got.is_contiguous()
    results["gather_reads_only"] = torch.equal(buffer, before)
    # A pool whose head dimension is strided too (heads of one row interleaved with another layer's).
    wide = torch.randn(4, 2 * HEADS, DIM, DIM)
    heads_view = wide[:, ::2]
    results["gather_strided_heads"] = torch.equal(gather_states(heads_view, ids[[0, 2]] % 4),
                                                  heads_view[(ids[[0, 2]] % 4).long()])

    new = torch.randn(4, HEADS, DIM, DIM)
    ids = torch.tensor([3, -1, 1, 5], dtype=torch.int32)  # row 0 unaddressed: a padding write would land there
    scatter_states(new, ids, pool)
    expect = before.clone()
    expect_pool = expect[1::3]
    for n, sid in enumerate(ids.tolist()):
        if sid >= 0:
            expect_pool[sid] = new[n]
    results["scatter_writes_exactly_the_addressed_rows"] = torch.equal(buffer, expect)
    try:
        scatter_states(new[:, :, :, :8], ids, pool)
        results["scatter_rejects_a_wrong_shape"] = "no error"
    except ValueError as exc:
        results["scatter_rejects_a_wrong_shape"] = "kda scatter_states" in str(exc) and "'states'" in str(exc)


def _wrapper_cases(results):
    from dsahal.backends.nvidia import kda_fla
    from dsahal.backends.triton_kernels.kda import kda_decode
    from dsahal.reference.kda import kda_prefill

    fake = RecordingChunkKda()
    kda_fla.import_chunk_kda = lambda: fake  # the route's only handle on fla
    lengths = [5, 0, 9, 3, 1]
    q, k, v, g, beta, cu = _inputs(lengths, torch.float16, torch.bfloat16, torch.float32, 2)
    ids = torch.tensor([4, 1, -1, 0, 2], dtype=torch.int32)  # the empty sequence's row 1 stays as it is
    buffer, pool = _strided_pool(6, 3)
    want_buffer = buffer.clone()
    original = pool.clone()
    # The route rounds beta to k's dtype (fla's dots take one dtype); the reference gets the same beta.
    want = kda_prefill(q, k, v, g, beta.to(k.dtype), cu, want_buffer[1::3], ids, 0.3, True)
    got = kda_fla.kda_prefill_fla(q, k, v, g, beta, cu, pool, ids, 0.3, True)
    call = fake.calls[-1]
    results["fla_output_is_returned_without_a_copy"] = (got.data_ptr() == call["o"].data_ptr()
                                                        and got.shape == v.shape and got.dtype == q.dtype)
    results["output_matches_reference"] = torch.allclose(got.double(), want.double(), atol=2e-3)
    results["pool_matches_reference_guards_untouched"] = torch.allclose(buffer, want_buffer, atol=1e-6) and \
        torch.equal(buffer[0::3], want_buffer[0::3]) and torch.equal(buffer[2::3], want_buffer[2::3])
    results["inputs_not_copied"] = all(
        call[name].data_ptr() == tensor.data_ptr() and call[name].dtype == tensor.dtype
        and call[name].stride()[1:] == tensor.stride() and call[name].shape[1:] == tensor.shape
        for name, tensor in (("q", q), ("k", k), ("v", v), ("g", g)))
    results["gate_keeps_its_dtype"] = call["g"].dtype == torch.bfloat16
    results["beta_in_k_dtype"] = call["beta"].dtype == k.dtype and torch.equal(call["beta"][0], beta.to(k.dtype))
    results["l2norm_inside_fla"] = call["use_qk_l2norm_in_kernel"] is True
    results["keywords"] = sorted(set(call) - {"q", "k", "v", "g", "beta", "initial", "o"})
    results["initial_states_are_the_rows"] = torch.equal(
        call["initial"], torch.stack([torch.zeros_like(original[0]) if sid < 0 else original[sid]
                                      for sid in ids.tolist()]))
    results["all_sequences_reach_fla"] = call["cu_seqlens_cpu"].tolist() == cu.tolist() and \
        call["cu_seqlens_cpu"].device.type == "cpu" and call["cu_seqlens"].tolist() == cu.tolist()
    cu64 = cu.long()
    kda_fla.kda_prefill_fla(q, k, v, g, beta, cu64, pool, ids, 0.3, True)
    # fla memoises chunk indices by the identity of cu_seqlens: the caller's own tensor must not go in.
    results["cu_seqlens_is_a_fresh_object"] = fake.calls[-1]["cu_seqlens"] is not cu64 and \
        fake.calls[-1]["cu_seqlens"].dtype == torch.int64

    # Prefill of all but each sequence's last token, then one decode step, equals the whole prefill.
    lengths = [4, 7, 2]
    q, k, v, g, beta, cu = _inputs(lengths, torch.float16, torch.float16, torch.float16, 4)
    ids = torch.tensor([2, 0, 5], dtype=torch.int32)
    _, whole_pool = _strided_pool(6, 5)
    _, split_pool = _strided_pool(6, 5)
    whole = kda_fla.kda_prefill_fla(q, k, v, g, beta, cu, whole_pool, ids, 0.25, True)
    last = (cu[1:] - 1).long()
    head = torch.ones(q.shape[0], dtype=torch.bool)
    head[last] = False
    short_cu = cu - torch.arange(len(lengths) + 1, dtype=torch.int32)
    part = kda_fla.kda_prefill_fla(q[head], k[head], v[head], g[head], beta[head], short_cu, split_pool, ids, 0.25,
                                   True)
    step = kda_decode(q[last], k[last], v[last], g[last], beta[last], split_pool, ids, 0.25, True)
    results["prefill_then_decode_equals_whole_prefill"] = (
        torch.allclose(split_pool, whole_pool, atol=1e-5)
        and torch.allclose(part.float(), whole[head].float(), atol=1e-3)
        and torch.allclose(step.float(), whole[last].float(), atol=2e-3))


def _run_all() -> dict:
    return run_groups((_state_row_cases, _wrapper_cases), keep=(str, list))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("case", ["gather_rows", "gather_reads_only", "gather_strided_heads",
                                  "scatter_writes_exactly_the_addressed_rows", "scatter_rejects_a_wrong_shape"])
def test_state_rows_move_exactly_the_addressed_pool_rows(interpreted, case):
    assert interpreted[case] is True


@pytest.mark.parametrize("case", ["output_matches_reference", "pool_matches_reference_guards_untouched",
                                  "all_sequences_reach_fla", "initial_states_are_the_rows",
                                  "prefill_then_decode_equals_whole_prefill"])
def test_route_matches_the_reference_around_a_recurrent_fla(interpreted, case):
    assert interpreted[case] is True


@pytest.mark.parametrize("case", ["inputs_not_copied", "gate_keeps_its_dtype", "beta_in_k_dtype",
                                  "l2norm_inside_fla", "fla_output_is_returned_without_a_copy",
                                  "cu_seqlens_is_a_fresh_object"])
def test_route_makes_no_copy_of_the_inputs_or_the_output(interpreted, case):
    assert interpreted[case] is True


def test_route_passes_only_keywords_fla_takes(interpreted):
    """The fake takes any keyword; fla 0.6's ``chunk_kda`` must have each one the route passes."""
    assert set(interpreted["keywords"]) == set(PASSED)
    fla_kda = pytest.importorskip("fla.ops.kda")
    import inspect

    assert set(PASSED) <= set(inspect.signature(fla_kda.chunk_kda).parameters)


def test_route_declines_mixed_input_dtypes(monkeypatch):
    from dsahal.backends.nvidia import config, kda_fla

    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT", raising=False)
    config.read_mode()
    x = torch.empty(4, 2, 16, dtype=torch.bfloat16, device="meta")
    pool = torch.empty(3, 2, 16, 16, device="meta")
    ids = torch.empty(1, dtype=torch.int32, device="meta")
    cu = torch.empty(2, dtype=torch.int32, device="meta")
    beta = torch.empty(4, 2, dtype=torch.bfloat16, device="meta")
    ok, reason = kda_fla.accepts(x, x.to(torch.float16), x, x, beta, cu, pool, ids, 0.25, True)
    assert not ok and "mixed q/k/v dtypes (bfloat16/float16/bfloat16)" in reason


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
