"""The chunked KDA prefill kernel (``backends/triton_kernels/kda_chunk.py``) under the Triton interpreter.

Under ``TRITON_INTERPRET=1`` (a child process, ``interpreter_child``), on tiny shapes, with fresh random
inputs (never zeros: gates in [-0.51, -0.01], beta in [0.05, 0.95]), this module checks:

* against the float64 reference (``dsahal.reference.kda.kda_prefill``): one call mixing sequence lengths
  1, 15, 0, 16, 17, 33 (a partial last chunk, exact multiples of 16, an empty sequence) with a padding
  state id (-1: starts from zero, writes nothing), on a pool that is a strided view inside a larger
  NaN-filled buffer (rows two apart, K rows wider than V): every byte outside the live rows' slabs must be
  unchanged, and a stray read would turn the output NaN. Variants: use_qk_l2norm on and off, K and V
  not powers of two (12, 24: masked channels and a masked V slab), a V slab as wide as V, fp16 inputs,
  the value columns in slices (``max_v``: how V past 128 runs), and the reduced-precision operand path (``operands="fp16"``: the casts and the 16-bit scratch of the
  GPU's bf16 path; bf16 dots are not bf16 under the interpreter);
* strongly negative gates (the clamp path): a chunk whose gates are all -30 would overflow the
  factorised decays without the clamp (NaN); the result must equal the reference on the clamped gates
  within fp32 rounding, and the reference on the raw gates within the clamp's documented bound;
* the chunked kernel (fp32 operands) against the token-by-token Triton kernel (``kda_prefill_recurrent``)
  within fp32 rounding, outputs and states;
* prefill then one decode step (``kda_decode``) equals a prefill of the whole sequences, and a prefill in
  two calls equals one call;
* empty calls (no tokens; no sequences) return the right shape and leave the pool alone;
* bad arguments are refused with a message naming them (in this process: no launch happens).

The kernel's output comes from ``torch.empty``; the child makes that NaN-filled (:func:`_poisoned`), so an
element the kernel fails to write shows as NaN. The child reports measured errors; the tests hold the
tolerances, so a failure prints the numbers. The module takes ~15 s on two cores.
"""
from __future__ import annotations

import json

import pytest
import torch

from kda_pools import pool_mask, pool_view, strided_pool
from interpreter_child import child_results, poisoned_empty, run_groups

HEADS = 2
FP32_EPS = 2.0**-23
TOL = {"float32": 1e-5, "float16": 2e-3}  # output vs float64 (max rel): fp32 rounding / fp16 output rounding
STATE_TOL = 1e-5  # states are fp32 in both
FP16_OPERAND_TOL = 4e-3  # operands="fp16": 11-bit operands of every MMA but the inverse's
CLAMP_TOL = 4 * 4.54e-5  # raw gates below the clamp: ~e^{GATE_MIN} = e^{-10} of a decayed term, x4 margin
AGREE_TOL = 2e-6  # chunked (fp32 operands) vs token-by-token: fp32 rounding in another order (~17 ulp)
LENGTHS = [1, 15, 0, 16, 17, 33]
IDS = [3, -1, 5, 0, 7, 1]  # sequence 1 (15 tokens) is a padding request; pool rows 2, 4, 6 are idle
POOL_ROWS = 8

# (label, K, V, block_v, input dtype, use_qk_l2norm, operands)
REFERENCE_CASES = (
    ("l2norm_k16_v32_bv16_float32", 16, 32, 16, "float32", True, "fp32"),
    ("nol2norm_k16_v32_bv16_float32", 16, 32, 16, "float32", False, "fp32"),
    ("masked_k12_v24_bv16_float32", 12, 24, 16, "float32", True, "fp32"),
    ("one_slab_k16_v32_bv32_float32", 16, 32, 32, "float32", True, "fp32"),
    ("l2norm_k16_v32_bv16_float16", 16, 32, 16, "float16", True, "fp32"),
    ("fp16_operands_k16_v32_bv16_float32", 16, 32, 16, "float32", True, "fp16"),
    # the GPU's default mode for 16-bit inputs (the interpreter runs its tf32 dots in fp32). The "bf16" and
    # "mixed" modes have bf16 dots, which the interpreter gets wrong (1e11 relative error on this case, a
    # numpy matmul that overflows): scripts/h200/kda_chunk_check.py checks them on a GPU
    ("tf32_mode_nol2norm_k16_v32_bv16_float16", 16, 32, 16, "float16", False, "tf32"),
    # pass A's options (the nvidia default's): the cumulative gate as an MMA (fp32 gates: tf32x3, run in fp32 here; fp16 gates: one fp16 MMA), the inverse's products as tf32 / tf32x3
    # (fp32 here), a register cap (ignored here)
    ("gate_scan_capped_k16_v32_bv16_float32", 16, 32, 16, "float32", True, "fp32",
     dict(scan_mma=True, inverse="tf32", prepare_maxnreg=168)),
    ("gate_scan_masked_k12_v24_bv16_float16", 12, 24, 16, "float16", True, "tf32",
     dict(scan_mma=True, inverse="tf32x3")),
    ("nol2norm_k16_v32_bv32_float16", 16, 32, 32, "float16", False, "tf32"),
    # fp64 gates (the op takes any float dtype for g and uses it in fp32): the gate scan takes the fp32 path
    ("gate_scan_fp64_gates_k16_v32_bv16_float16", 16, 32, 16, "float16", True, "tf32",
     dict(scan_mma=True, gate_dtype="float64")),
    # pass B's programs in the order longest sequence first (a permutation of the sequences; padding id included)
    ("longest_first_k16_v32_bv16_float32", 16, 32, 16, "float32", True, "fp32", dict(longest_first=True)),
    # the value columns in slices (V past max_v: one call a slice, on the slice of v and of the pool's view; the
    # backend splits V past 128 so), here slices of 16, 16 and 8 columns, and of 16, 16 and 4 in the tf32 mode
    ("v_slices_k16_v40_max16_float32", 16, 40, 16, "float32", True, "fp32", dict(max_v=16)),
    ("v_slices_tf32_k12_v36_max16_float16", 12, 36, 16, "float16", False, "tf32", dict(max_v=16, scan_mma=True)),
)
# operands -> (output, state) tolerance where the mode's roundings, not the input dtype's, bound the error
OPERAND_TOL = {"fp16": (FP16_OPERAND_TOL, FP16_OPERAND_TOL)}


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


def _poisoned():
    """``torch.empty`` inside ``dsahal.backends.triton_kernels.kda_chunk`` NaN-filled (:func:`interpreter_child.poisoned_empty`)."""
    from dsahal.backends.triton_kernels import kda_chunk

    return poisoned_empty(kda_chunk)


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _inputs(tokens, key_dim, value_dim, dtype, seed, l2norm):
    """q, k, g ``[T, H, K]``, v ``[T, H, V]``, beta ``[T, H]``, random, never zero. Without the L2
    normalisation q and k are scaled so that ``|k|² ≈ 1`` (a stable delta rule, as the normalised one)."""
    gen = torch.Generator().manual_seed(seed)
    size = 1.0 if l2norm else key_dim**-0.5
    q, k = (size * torch.randn(tokens, HEADS, key_dim, generator=gen) for _ in range(2))
    v = torch.randn(tokens, HEADS, value_dim, generator=gen)
    g = -0.5 * torch.rand(tokens, HEADS, key_dim, generator=gen) - 0.01
    beta = 0.9 * torch.rand(tokens, HEADS, generator=gen) + 0.05
    return [x.to(dtype) for x in (q, k, v, g, beta)]


def _rel(got, want) -> float:
    """max |got - want| / max |want| in float64 (NaN if got has a NaN)."""
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _reference(tensors, cu, pool, ids, scale, l2norm):
    """The float64 oracle on float64 copies of the inputs; updates ``pool`` at the live ids."""
    from dsahal.reference.kda import kda_prefill as reference

    return reference(*(t.double() for t in tensors), cu, pool, ids, scale, l2norm)


def _against_reference(label, tensors, key_dim, value_dim, block_v, l2norm, operands, seed, results,
                       reference_gates=None, kernel_ids=None, options=None):
    """The mixed-length call on a strided pool: output / state errors vs the reference and whether every
    byte outside the live slabs is unchanged. ``reference_gates``: the gates the reference is given;
    ``kernel_ids``: the ids the kernel is given (the reference gets ``IDS``); ``options``: more launcher options."""
    from dsahal.backends.triton_kernels.kda_chunk import kda_prefill_chunked

    cu, ids = _cu(LENGTHS), torch.tensor(IDS, dtype=torch.int32)
    given = ids if kernel_ids is None else torch.tensor(kernel_ids, dtype=torch.int32)
    buffer, pool = _pool(POOL_ROWS, key_dim, value_dim, seed)
    before = buffer.clone()
    want_buffer = buffer.clone()
    want_pool = pool_view(want_buffer, POOL_ROWS, value_dim)
    ref_tensors = list(tensors) if reference_gates is None else [*tensors[:3], reference_gates, tensors[4]]
    scale = key_dim**-0.5
    want = _reference(ref_tensors, cu, want_pool, ids, scale, l2norm)
    with _poisoned():
        got = kda_prefill_chunked(*tensors, cu, pool, given, scale, l2norm, block_v=block_v, operands=operands,
                                  **(options or {}))
    live = ids[ids >= 0].long()
    inside = pool_mask(buffer, POOL_ROWS, value_dim, live)
    bits, old_bits = buffer.view(torch.int32), before.view(torch.int32)
    results[label] = dict(
        o_err=_rel(got, want), state_err=_rel(pool[live], want_pool[live]),
        other_bytes_unchanged=torch.equal(bits[~inside], old_bits[~inside]),
        finite=bool(torch.isfinite(got).all()), dtype=str(got.dtype).split(".")[-1], shape=list(got.shape))


def _reference_cases(results):
    for n, (label, key_dim, value_dim, block_v, dname, l2norm, operands, *options) in enumerate(REFERENCE_CASES):
        tensors = _inputs(sum(LENGTHS), key_dim, value_dim, getattr(torch, dname), 100 + 10 * n, l2norm)
        options = dict(options[0]) if options else {}
        if "gate_dtype" in options:  # the gates in another dtype than the other inputs
            tensors[3] = tensors[3].to(getattr(torch, options.pop("gate_dtype")))
        _against_reference(label, tensors, key_dim, value_dim, block_v, l2norm, operands, 101 + 10 * n, results,
                           options=options)
    # an id one past the pool is a padding request too (the kernel's rule, as kda.py's; the op's contract has
    # only -1, so the reference is given -1): no write lands on the guard row after the pool
    tensors = _inputs(sum(LENGTHS), 16, 32, torch.float32, 190, True)
    _against_reference("past_pool_id_k16_v32_bv16_float32", tensors, 16, 32, 16, True, "fp32", 191, results,
                       kernel_ids=[POOL_ROWS if sid < 0 else sid for sid in IDS])


def _clamp_cases(results):
    """Gates far below ``GATE_MIN``: half the channels of every token in [-30, -12], and all of tokens
    16..31 (the 17-token sequence's first chunk and the 33-token one's second) at -30."""
    from dsahal.backends.triton_kernels.kda_chunk import GATE_MIN

    key_dim, value_dim = 16, 32
    tensors = _inputs(sum(LENGTHS), key_dim, value_dim, torch.float32, 300, True)
    g = tensors[3].clone()
    gen = torch.Generator().manual_seed(301)
    g[:, :, ::2] = -12.0 - 18.0 * torch.rand(g[:, :, ::2].shape, generator=gen)
    starts = _cu(LENGTHS).tolist()
    for first in (starts[4], starts[5] + 16):  # a whole chunk of -30 (would overflow e^{8·30} unclamped)
        g[first:first + 16] = -30.0
    tensors[3] = g
    _against_reference("clamp_vs_clamped_reference", tensors, key_dim, value_dim, 16, True, "fp32", 302, results,
                       reference_gates=g.clamp_min(GATE_MIN))
    _against_reference("clamp_vs_raw_reference", tensors, key_dim, value_dim, 16, True, "fp32", 302, results)


def _agreement_cases(results):
    """Chunked (fp32 operands) vs the token-by-token kernel on the same pool rows and inputs."""
    from dsahal.backends.triton_kernels.kda import kda_prefill_recurrent
    from dsahal.backends.triton_kernels.kda_chunk import kda_prefill_chunked

    for n, (key_dim, value_dim, l2norm) in enumerate(((16, 32, True), (12, 24, False))):
        tensors = _inputs(sum(LENGTHS), key_dim, value_dim, torch.float32, 400 + n, l2norm)
        cu, ids = _cu(LENGTHS), torch.tensor(IDS, dtype=torch.int32)
        _, pool = _pool(POOL_ROWS, key_dim, value_dim, 410 + n)
        mine, theirs = pool.clone(), pool.clone()
        scale = key_dim**-0.5
        with _poisoned():
            got = kda_prefill_chunked(*tensors, cu, mine, ids, scale, l2norm, block_v=16, operands="fp32")
        base = kda_prefill_recurrent(*tensors, cu, theirs, ids, scale, l2norm, block_v=16)
        results[f"agree_k{key_dim}_v{value_dim}"] = dict(o_diff=_rel(got, base), state_diff=_rel(mine, theirs))


def _split_cases(results):
    """(a) chunked prefill of all but the last token, then ``kda_decode`` of it, vs a chunked prefill of all;
    (b) a chunked prefill in two calls (split at token 20 of each sequence) vs one call."""
    from dsahal.backends.triton_kernels.kda import kda_decode
    from dsahal.backends.triton_kernels.kda_chunk import kda_prefill_chunked

    key_dim, value_dim, lengths = 16, 32, [17, 32, 37]
    ids = torch.tensor([4, 0, 2], dtype=torch.int32)
    scale = key_dim**-0.5
    tensors = _inputs(sum(lengths), key_dim, value_dim, torch.float32, 500, True)
    _, pool = _pool(5, key_dim, value_dim, 501)
    starts = _cu(lengths).tolist()

    def pieces(bounds):
        """Per sequence the tokens [lo(b), hi(b)): the packed inputs and their cu_seqlens."""
        index = torch.cat([torch.arange(starts[b] + lo, starts[b] + hi) for b, (lo, hi) in enumerate(bounds)])
        return [t[index] for t in tensors], _cu([hi - lo for lo, hi in bounds]), index

    whole_pool = pool.clone()
    whole = kda_prefill_chunked(*tensors, _cu(lengths), whole_pool, ids, scale, True, block_v=16, operands="fp32")
    # (a)
    step_pool = pool.clone()
    head, head_cu, _ = pieces([(0, n - 1) for n in lengths])
    kda_prefill_chunked(*head, head_cu, step_pool, ids, scale, True, block_v=16, operands="fp32")
    last = torch.tensor([s - 1 for s in starts[1:]])
    out = kda_decode(*(t[last] for t in tensors), step_pool, ids, scale, True, block_v=16)
    results["prefill_then_decode"] = dict(o_diff=_rel(out, whole[last]), state_diff=_rel(step_pool, whole_pool))
    # (b)
    two_pool = pool.clone()
    outs = []
    for bounds in ([(0, 20 if n > 20 else n) for n in lengths], [(20 if n > 20 else n, n) for n in lengths]):
        part, part_cu, index = pieces(bounds)
        outs.append((index, kda_prefill_chunked(*part, part_cu, two_pool, ids, scale, True, block_v=16,
                                                operands="fp32")))
    joined = torch.empty_like(whole)
    for index, o in outs:
        joined[index] = o
    results["prefill_in_two_calls"] = dict(o_diff=_rel(joined, whole), state_diff=_rel(two_pool, whole_pool))


def _empty_cases(results):
    """No tokens (two empty sequences), and no sequences: the output's shape, the pool unchanged."""
    from dsahal.backends.triton_kernels.kda_chunk import kda_prefill_chunked

    _, pool = _pool(3, 16, 16, 600)
    before = pool.clone()
    for label, lengths, ids in (("no_tokens", [0, 0], [1, -1]), ("no_sequences", [], [])):
        tensors = _inputs(0, 16, 16, torch.float32, 601, True)
        got = kda_prefill_chunked(*tensors, _cu(lengths), pool, torch.tensor(ids, dtype=torch.int32), 0.25, True,
                                  block_v=16, operands="fp32")
        results[f"empty_{label}"] = dict(shape=list(got.shape), pool_unchanged=torch.equal(pool, before))


def _pool(rows, key_dim, value_dim, seed):
    return strided_pool(rows, HEADS, key_dim, value_dim, seed)


def _run_all() -> dict:
    return run_groups((_reference_cases, _clamp_cases, _agreement_cases, _split_cases, _empty_cases),
                      normalise=False)


# ----------------------------------------------------------------------------------------------------
# Tests (parent process)


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def _check_reference_entry(key, entry, o_tol, state_tol, dtype):
    assert entry["dtype"] == dtype, f"{key}: output dtype {entry['dtype']}, expected q's dtype {dtype}"
    assert entry["shape"][:2] == [sum(LENGTHS), HEADS], f"{key}: output shape {entry['shape']}"
    assert entry["finite"], f"{key}: the output has a NaN or inf (an unwritten element, a stray read, an overflow)"
    assert entry["o_err"] < o_tol, f"{key}: output max rel err {entry['o_err']:.3e} vs float64 reference (tol {o_tol})"
    assert entry["state_err"] < state_tol, (f"{key}: live state rows max rel err {entry['state_err']:.3e} "
                                            f"(tol {state_tol})")
    assert entry["other_bytes_unchanged"], (f"{key}: a buffer byte outside the live sequences' pool slabs changed "
                                            "(the padding id's row, an idle row, a guard row or the spare columns)")


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_chunked_prefill_matches_the_float64_reference(interpreted, case):
    label, _, _, _, dtype, _, operands, *_ = case
    o_tol, state_tol = OPERAND_TOL.get(operands, (TOL[dtype], STATE_TOL))
    _check_reference_entry(label, interpreted[label], o_tol, state_tol, dtype)


def test_an_id_past_the_pool_is_a_padding_request(interpreted):
    key = "past_pool_id_k16_v32_bv16_float32"
    _check_reference_entry(key, interpreted[key], TOL["float32"], STATE_TOL, "float32")


def test_gates_below_the_clamp_give_the_clamped_recurrence_and_stay_within_the_clamps_bound(interpreted):
    _check_reference_entry("clamp_vs_clamped_reference", interpreted["clamp_vs_clamped_reference"], TOL["float32"],
                           STATE_TOL, "float32")
    _check_reference_entry("clamp_vs_raw_reference", interpreted["clamp_vs_raw_reference"], CLAMP_TOL, CLAMP_TOL,
                           "float32")


@pytest.mark.parametrize("key", ["agree_k16_v32", "agree_k12_v24"])
def test_chunked_and_token_by_token_kernels_agree_within_fp32_rounding(interpreted, key):
    entry = interpreted[key]
    assert entry["o_diff"] <= AGREE_TOL, f"{key}: outputs differ by {entry['o_diff']:.3e} (max rel, tol {AGREE_TOL})"
    assert entry["state_diff"] <= AGREE_TOL, f"{key}: pools differ by {entry['state_diff']:.3e} (max rel)"


@pytest.mark.parametrize("key", ["prefill_then_decode", "prefill_in_two_calls"])
def test_a_prefill_continued_equals_the_prefill_of_the_whole_sequence(interpreted, key):
    entry = interpreted[key]
    assert entry["o_diff"] <= AGREE_TOL, f"{key}: outputs differ by {entry['o_diff']:.3e} (max rel, tol {AGREE_TOL})"
    assert entry["state_diff"] <= AGREE_TOL, f"{key}: final states differ by {entry['state_diff']:.3e} (max rel)"


@pytest.mark.parametrize("label, shape", [("no_tokens", [0, HEADS, 16]), ("no_sequences", [0, HEADS, 16])])
def test_empty_calls_return_the_shape_and_leave_the_pool(interpreted, label, shape):
    entry = interpreted[f"empty_{label}"]
    assert entry["shape"] == shape, f"{label}: output shape {entry['shape']}, expected {shape}"
    assert entry["pool_unchanged"], f"{label}: the pool changed"


@pytest.mark.parametrize("change, words", [
    (dict(operands="int8"), ["operands", "'int8'"]),
    (dict(block_v=24), ["block_v", "24"]),
    (dict(block_v=8), ["block_v", "8"]),
    (dict(key_dim=160), ["K", "160"]),
    # (V past 128 is split into slices, not refused: the split's own bound)
    (dict(max_v=0), ["max_v", "0"]),
    (dict(max_v=256), ["max_v", "256"]),
    (dict(pool_v_stride=2), ["state_pool", "unit stride"]),
    (dict(inverse="fp8"), ["inverse", "'fp8'"]),
])
def test_bad_arguments_are_refused_before_any_launch(change, words):
    """No launch happens before these checks, so this runs in the test process (no interpreter needed)."""
    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels.kda_chunk import kda_prefill_chunked

    key_dim, value_dim = change.get("key_dim", 16), change.get("value_dim", 16)
    tensors = _inputs(5, key_dim, value_dim, torch.float32, 7, True)
    pool = torch.randn(2, HEADS, key_dim, value_dim * change.get("pool_v_stride", 1))[..., ::change.get("pool_v_stride", 1)]
    before = pool.clone()
    options = {name: value for name, value in change.items()
               if name in ("operands", "block_v", "inverse", "max_v")}
    with pytest.raises(ValueError) as info:
        kda_prefill_chunked(*tensors, _cu([5]), pool, torch.tensor([1], dtype=torch.int32), 0.25, True, **options)
    message = str(info.value)
    assert "kda" in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert torch.equal(pool, before), "the pool changed although the call was refused"


@pytest.mark.parametrize("operands", ["bf16", "fp32", "fp16", "tf32", "mixed"])
@pytest.mark.parametrize("dims", [(128, 128), (12, 24), (16, 100)])
def test_the_documented_scratch_size_is_what_a_call_allocates(operands, dims):
    """``scratch_bytes`` (the module docstring's formula) against the views the launcher allocates (no launch)."""
    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels import kda_chunk

    key_dim, value_dim = dims
    tokens, sequences, heads = 37, 3, 2
    _, dtype, query_dtype = kda_chunk.OPERANDS[operands]
    views = kda_chunk._scratch(tokens, sequences, heads, kda_chunk._block(key_dim), kda_chunk._block(value_dim), dtype,
                               query_dtype, "cpu")
    allocated = sum(view.numel() * view.element_size() for view in views)
    assert allocated == kda_chunk.scratch_bytes(tokens, sequences, heads, key_dim, value_dim, operands)
    assert len({view.untyped_storage().data_ptr() for view in views}) == 1, "expected one allocation"
    assert all(view.data_ptr() % 16 == 0 for view in views), "every region 16-byte aligned (Triton's specialisation)"


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
