"""The ``scalar_row`` KDA decode kernel (``kda_decode_step_kernel``) against the float64 reference.

``backends/triton_kernels/kda.py``'s ``kda_decode(..., scalar_row=True)`` launches a second decode kernel
(options ``fused_output``, ``stream_state``, ``num_stages``, ``maxnreg``; the defaults keep
``kda_recurrent_kernel``). Under ``TRITON_INTERPRET=1`` (a child process, ``interpreter_child``), on tiny
shapes with fp32 / fp16 inputs, this module checks:

* the unmasked (``EVEN``) branch: K, V powers of two, ``block_v`` divides V;
* the masked branch: K not a power of two and / or V not a multiple of ``block_v``;
* ``fused_output`` + ``stream_state`` with padding requests (id -1: zero output, no state read or written,
  the op contract of ``dsahal.ops.kda.kda_decode``) on a pool that is a strided view of a larger buffer
  (rows two apart, K stride wider than V): every buffer byte outside the addressed slabs is unchanged;
* the default kernel and ``scalar_row`` agree within fp32 rounding;
* an fp64 gate gives the bits of the fp32 gate it holds exactly (the launchers convert it: ``limits.kda_gate``);
* the options that need ``scalar_row=True`` are refused without it (in this process: no launch happens).

The kernel's output comes from ``torch.empty``; the child makes that allocation NaN-filled (:func:`_poisoned`),
so an element the kernel fails to write (a padding row, a masked tail column) shows as NaN, not as
whatever the allocator handed back.

The child reports measured errors (max |got - want| / max |want|) and flags; the tests hold the tolerances,
so a failure prints the numbers.
"""
from __future__ import annotations

import json

import pytest
import torch

from kda_pools import pool_mask, pool_view, strided_pool
from interpreter_child import child_results, poisoned_empty, run_groups

HEADS = 2
FP32_EPS = 2.0**-23
TOL = {"float32": 1e-5, "float16": 2e-3}  # output vs float64: fp32 accumulation / fp16 output rounding
STATE_TOL = 1e-5  # the state is fp32 in both, from exact inputs
AGREE_TOL = 64 * FP32_EPS  # default vs scalar_row: a K-term fp32 reduction in another order, K <= 16

# (label, K, V, block_v): the plain (EVEN) case and the masked ones (EVEN is K == next_pow2(K) and
# block_v divides V, after block_v = min(block_v, next_pow2(V))).
PLAIN = ("plain_k16_v32_bv16", 16, 32, 16)
MASKED = (("masked_k12_v40_bv16", 12, 40, 16),  # K not a power of two, V = 2.5 blocks
          ("masked_k16_v24_bv16", 16, 24, 16),  # only V's tail masked
          ("masked_k12_v32_bv16", 12, 32, 16))  # only K's tail masked
# scalar_row options run on the plain and the masked shapes
OPTIONS = {
    "scalar": dict(scalar_row=True),
    "fused": dict(scalar_row=True, fused_output=True),
    "fused_stream": dict(scalar_row=True, fused_output=True, stream_state=True),
    "stages_maxnreg": dict(scalar_row=True, num_stages=2, maxnreg=128),  # accepted, and change no result
}
# fp16 inputs (converted to fp32 in the kernel, fp16 output) on two of them: the conversion is option-independent
DTYPES = {"scalar": ("float32", "float16"), "fused": ("float32",), "fused_stream": ("float32", "float16"),
          "stages_maxnreg": ("float32",)}


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


def _poisoned():
    """``torch.empty`` inside ``dsahal.backends.triton_kernels.kda`` NaN-filled (:func:`interpreter_child.poisoned_empty`)."""
    from dsahal.backends.triton_kernels import kda

    return poisoned_empty(kda)


def _inputs(batch, key_dim, value_dim, dtype, seed):
    """q, k, g ``[B, H, K]``, v ``[B, H, V]`` in ``dtype``, beta ``[B, H]``: random and never zero (a decay
    g in [-0.51, -0.01], beta in [0.05, 0.95]) so that every term of the update is exercised."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, HEADS, key_dim, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(batch, HEADS, value_dim, generator=gen).to(dtype)
    g = (-0.5 * torch.rand(batch, HEADS, key_dim, generator=gen) - 0.01).to(dtype)
    beta = (0.9 * torch.rand(batch, HEADS, generator=gen) + 0.05).to(dtype)
    return q, k, v, g, beta


def _dense_pool(rows, key_dim, value_dim, seed):
    """``[rows, H, K, V]`` fp32, random."""
    gen = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(rows, HEADS, key_dim, value_dim, generator=gen)


def _guarded_dense_pool(rows, key_dim, value_dim, seed):
    """``(buffer, pool)``: pool ``buffer[1:-1]`` is a dense ``[rows, H, K, V]`` pool (the kernel's
    ``STRIDE_K == V`` case) between two NaN guard rows: pool rows -1 and ``rows`` are inside the buffer,
    so a stray write there is seen, and a stray read there turns the output NaN."""
    buffer = torch.full((rows + 2, HEADS, key_dim, value_dim), float("nan"))
    buffer[1:-1] = _dense_pool(rows, key_dim, value_dim, seed)
    return buffer, buffer[1:-1]


def _rel(got, want) -> float:
    """max |got - want| / max |want| in float64 (NaN if got has a NaN)."""
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _reference(tensors, pool, ids, scale, l2norm):
    """The float64 oracle on float64 copies of the inputs (so its output is not rounded to their dtype);
    updates ``pool`` in place at the live ids."""
    from dsahal.reference.kda import kda_decode as reference

    return reference(*(t.double() for t in tensors), pool, ids, scale, l2norm)


def _against_reference(label, key_dim, value_dim, block_v, options, dtype, l2norm, seed, results):
    """Dense pool, ids with one padding request; records output / state errors vs the reference,
    whether the rows not addressed are bitwise unchanged, and whether the padding output is zero."""
    from dsahal.backends.triton_kernels.kda import kda_decode

    tensors = _inputs(4, key_dim, value_dim, dtype, seed)
    buffer, pool = _guarded_dense_pool(7, key_dim, value_dim, seed + 1)
    ids = torch.tensor([6, 0, -1, 3], dtype=torch.int32)  # the first and last pool rows: next to the guards
    scale = key_dim**-0.5
    mine_buffer, want_pool = buffer.clone(), pool.clone()
    mine = mine_buffer[1:-1]
    want = _reference(tensors, want_pool, ids, scale, l2norm)
    with _poisoned():
        got = kda_decode(*tensors, mine, ids, scale, l2norm, block_v=block_v, **options)
    live = ids[ids >= 0].long()
    idle = torch.ones(buffer.shape[0], dtype=torch.bool)  # buffer rows: the guards and the pool rows not addressed
    idle[live + 1] = False
    results[label] = dict(
        o_err=_rel(got, want), state_err=_rel(mine[live], want_pool[live]),
        idle_rows_unchanged=torch.equal(mine_buffer[idle].view(torch.int32), buffer[idle].view(torch.int32)),
        padding_zero=bool((got[ids < 0] == 0).all()), dtype=str(got.dtype).split(".")[-1],
        shape=list(got.shape))


def _shape_cases(results):
    """(1) and (2): every scalar_row option on the plain and the masked shapes, fp32 and fp16 inputs."""
    seed = 0
    for label, key_dim, value_dim, block_v in (PLAIN,) + MASKED:
        for name, options in OPTIONS.items():
            for dname in DTYPES[name]:
                seed += 10
                dtype = getattr(torch, dname)
                _against_reference(f"{label}_{name}_{dname}", key_dim, value_dim, block_v, options, dtype, True,
                                   seed, results)
    # without the L2 normalisation (q, k used as given), both kernel branches
    for label, key_dim, value_dim, block_v in (PLAIN, MASKED[0]):
        seed += 10
        _against_reference(f"{label}_fused_nol2_float32", key_dim, value_dim, block_v, OPTIONS["fused"],
                           torch.float32, False, seed, results)


def _strided_padding_cases(results):
    """(3): fused_output + stream_state on a strided pool view with two padding requests (id -1), on the
    EVEN branch and each masked shape; then an id one past the pool (the kernel's docstring: out of range
    is padding too; the op's contract only has -1, so the reference is given -1 for it)."""
    from dsahal.backends.triton_kernels.kda import kda_decode

    options = dict(scalar_row=True, fused_output=True, stream_state=True)
    rows = 6
    for n, (label, key_dim, value_dim, block_v) in enumerate((PLAIN,) + MASKED):
        for dtype in (torch.float32, torch.float16):
            seed = 500 + 10 * n + (dtype == torch.float16)
            dname = str(dtype).split(".")[-1]
            tensors = _inputs(5, key_dim, value_dim, dtype, seed)
            scale = key_dim**-0.5
            for case, ids_list, ref_list in (("padding", [3, -1, 0, -1, 5], [3, -1, 0, -1, 5]),
                                             ("past_pool", [4, rows, 1, -1, 2], [4, -1, 1, -1, 2])):
                buffer, pool = _pool(rows, key_dim, value_dim, seed + 1)
                before = buffer.clone()
                want_buffer, _ = _pool(rows, key_dim, value_dim, seed + 1)
                want_pool = pool_view(want_buffer, rows, value_dim)
                ids, ref_ids = (torch.tensor(x, dtype=torch.int32) for x in (ids_list, ref_list))
                want = _reference(tensors, want_pool, ref_ids, scale, True)
                with _poisoned():
                    got = kda_decode(*tensors, pool, ids, scale, True, block_v=block_v, **options)
                live = ref_ids[ref_ids >= 0].long()
                inside = pool_mask(buffer, rows, value_dim, live)
                bits, old_bits = buffer.view(torch.int32), before.view(torch.int32)
                pad = ref_ids < 0
                results[f"strided_{case}_{label}_{dname}"] = dict(
                    o_err=_rel(got[~pad], want[~pad]), state_err=_rel(pool[live], want_pool[live]),
                    other_bytes_unchanged=torch.equal(bits[~inside], old_bits[~inside]),
                    padding_zero=bool((got[pad] == 0).all()), dtype=str(got.dtype).split(".")[-1],
                    shape=list(got.shape))


def _agreement_cases(results):
    """(4): default kernel vs scalar_row (plain and fused) on fp32 inputs, same pool and ids: the largest
    output / state difference relative to the largest magnitude."""
    from dsahal.backends.triton_kernels.kda import kda_decode

    for n, (label, key_dim, value_dim, block_v) in enumerate((PLAIN, MASKED[0])):
        tensors = _inputs(4, key_dim, value_dim, torch.float32, 900 + n)
        buffer, _ = _guarded_dense_pool(6, key_dim, value_dim, 901 + n)  # guards: a stray write stays in memory
        ids = torch.tensor([2, -1, 5, 0], dtype=torch.int32)
        scale = key_dim**-0.5
        base_pool = buffer.clone()[1:-1]
        with _poisoned():
            base = kda_decode(*tensors, base_pool, ids, scale, True, block_v=block_v)
        for name in ("scalar", "fused", "fused_stream"):
            mine = buffer.clone()[1:-1]
            with _poisoned():
                got = kda_decode(*tensors, mine, ids, scale, True, block_v=block_v, **OPTIONS[name])
            results[f"agree_{label}_{name}"] = dict(
                o_diff=_rel(got, base), state_diff=_rel(mine, base_pool),
                same_padding=torch.equal(got[1], base[1]))
        # an fp64 gate (the op takes any float gate, used in fp32): the launchers hand the kernels its fp32
        # values, so the same bits as the fp32 gate it holds exactly, on both kernels
        q, k, v, g, beta = tensors
        for name, options in (("default", {}), ("scalar", OPTIONS["scalar"])):
            fp32_pool, fp64_pool = buffer.clone()[1:-1], buffer.clone()[1:-1]
            with _poisoned():
                want = kda_decode(q, k, v, g, beta, fp32_pool, ids, scale, True, block_v=block_v, **options)
                got = kda_decode(q, k, v, g.double(), beta, fp64_pool, ids, scale, True, block_v=block_v, **options)
            results[f"fp64_gate_{label}_{name}"] = dict(same_output=torch.equal(got, want),
                                                        same_state=torch.equal(fp64_pool, fp32_pool))


def _pool(rows, key_dim, value_dim, seed):
    return strided_pool(rows, HEADS, key_dim, value_dim, seed)


def _run_all() -> dict:
    return run_groups((_shape_cases, _strided_padding_cases, _agreement_cases), normalise=False)


# ----------------------------------------------------------------------------------------------------
# Tests (parent process)


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def _shape_ids():
    out = [f"{label}_{name}_{dtype}" for label, *_ in (PLAIN,) + MASKED for name in OPTIONS for dtype in DTYPES[name]]
    return out + [f"{PLAIN[0]}_fused_nol2_float32", f"{MASKED[0][0]}_fused_nol2_float32"]


def _check_against_reference(entry, dtype, key, batch):
    assert entry["dtype"] == dtype, f"{key}: output dtype {entry['dtype']}, expected q's dtype {dtype}"
    tol = TOL[dtype]
    assert entry["o_err"] < tol, f"{key}: output max rel err {entry['o_err']:.3e} vs float64 reference (tol {tol})"
    assert entry["state_err"] < STATE_TOL, (f"{key}: updated state rows max rel err {entry['state_err']:.3e} "
                                            f"(tol {STATE_TOL})")
    assert entry["padding_zero"], f"{key}: padding request's output is not all zero: {entry}"
    assert entry["shape"][:2] == [batch, HEADS], f"{key}: output shape {entry['shape']}, expected [{batch}, {HEADS}, V]"


@pytest.mark.parametrize("key", _shape_ids())
def test_scalar_row_matches_the_float64_reference_on_plain_and_masked_shapes(interpreted, key):
    entry = interpreted[key]
    _check_against_reference(entry, key.rsplit("_", 1)[1], key, 4)
    assert entry["idle_rows_unchanged"], (f"{key}: a pool row that no request addresses (or a guard row around "
                                          "the pool) changed")


@pytest.mark.parametrize("label", [label for label, *_ in (PLAIN,) + MASKED])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", ["padding", "past_pool"])
def test_fused_streamed_decode_on_a_strided_pool_touches_only_the_addressed_rows(interpreted, label, dtype, case):
    key = f"strided_{case}_{label}_{dtype}"
    entry = interpreted[key]
    _check_against_reference(entry, dtype, key, 5)
    assert entry["other_bytes_unchanged"], (f"{key}: a buffer byte outside the live requests' pool slabs changed "
                                            "(padding row, guard row, spare K-row columns or an idle row)")


@pytest.mark.parametrize("label", [PLAIN[0], MASKED[0][0]])
@pytest.mark.parametrize("name", ["scalar", "fused", "fused_stream"])
def test_default_and_scalar_row_kernels_agree_within_fp32_rounding(interpreted, label, name):
    entry = interpreted[f"agree_{label}_{name}"]
    assert entry["o_diff"] <= AGREE_TOL, f"{label} {name}: outputs differ by {entry['o_diff']:.3e} (max rel)"
    assert entry["state_diff"] <= AGREE_TOL, f"{label} {name}: pools differ by {entry['state_diff']:.3e} (max rel)"
    assert entry["same_padding"], f"{label} {name}: padding outputs differ"


@pytest.mark.parametrize("options, names", [
    (dict(fused_output=True), ["fused_output"]),
    (dict(stream_state=True), ["stream_state"]),
    (dict(maxnreg=128), ["maxnreg"]),
    (dict(num_stages=2), ["num_stages"]),
    (dict(fused_output=True, stream_state=True), ["fused_output", "stream_state"]),
])
def test_scalar_row_options_without_scalar_row_are_refused(options, names):
    """No launch happens before the check, so this runs in the test process (no interpreter needed)."""
    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels.kda import kda_decode

    tensors = _inputs(2, 16, 16, torch.float32, 7)
    pool = _dense_pool(3, 16, 16, 8)
    before = pool.clone()
    ids = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        kda_decode(*tensors, pool, ids, 0.25, True, block_v=16, **options)
    message = str(info.value)
    assert "kda_decode" in message and "scalar_row=True" in message and "scalar_row=False" in message, message
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    for name in {"fused_output", "stream_state", "maxnreg", "num_stages"} - set(names):
        assert name not in message, f"{name!r} named though not asked for: {message!r}"
    assert torch.equal(pool, before), "the pool changed although the call was refused"


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))


@pytest.mark.parametrize("label", [PLAIN[0], MASKED[0][0]])
@pytest.mark.parametrize("name", ["default", "scalar"])
def test_an_fp64_gate_is_served_as_the_fp32_gate_it_holds(interpreted, label, name):
    entry = interpreted[f"fp64_gate_{label}_{name}"]
    assert entry["same_output"] and entry["same_state"], f"{label} {name}: fp64 gate against its fp32 values: {entry}"

