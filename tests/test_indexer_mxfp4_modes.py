"""The MXFP4 decode modes of the block-tile indexer (``indexer_decode.MXFP4_MODES``, launcher
``mxfp4_mode``) against the float64 reference, under ``TRITON_INTERPRET=1`` on the CPU.

The keys are raw random records: every e2m1 code in both nibbles (signed zeros included) and ue8m0 scale
bytes spread over 2^-127 (byte 0) .. 2^60, so each 32-dim block of a key has its own power of two. The
interpreter's bf16 dots are wrong, so the bf16 modes run with exact fp32 dots (``dot=DOT_FP32``); the
fp16 mode (3) with fp16 queries and the FP8 mode (4) with FP8 queries run as they would on the GPU.
The H200 checks the bf16 MMAs in ``scripts/h200/mxfp4_indexer_sweep.py``.
"""
from __future__ import annotations

import json

import pytest

from interpreter_child import child_results, run_groups

TOL = 1e-5  # relative (norm) error vs the float64 reference: exact keys, fp32 accumulation
MODES = (1, 2, 3, 4, 5, 6)


def _pages(torch, blocks, block_tokens):
    """``[blocks, block_tokens, 68]`` MXFP4 records from random bytes: 64 bytes of e2m1 pairs, 4 scale bytes
    in 100..187 (2^-27 .. 2^60), one block of every eighth key at byte 0 (2^-127, subnormal)."""
    pages = torch.randint(0, 256, (blocks, block_tokens, 68), dtype=torch.uint8)
    pages[..., 64:] = torch.randint(100, 188, (blocks, block_tokens, 4), dtype=torch.uint8)
    pages[:, ::8, 65] = 0
    return pages


def _mode_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.reference.indexer import indexer_score as reference

    # three requests: 1, 5 and 3 tokens (request 0's run split by request 2), positions ending mid-tile,
    # unmapped (-1) and out-of-range (999) blocks, 16-token blocks
    table = torch.tensor([[3, 1, 0, 7, -1, 5, 9],
                          [2, 4, 6, 8, 999, 10, 11],
                          [11, -1, 0, 5, 6, 1, 2]], dtype=torch.int32)
    req = torch.tensor([1, 0, 0, 0, 0, 0, 2, 2, 0, 2], dtype=torch.int32)
    pos = torch.tensor([70, 20, 37, 38, 39, 95, 5, 99, 52, 100], dtype=torch.int32)
    width = 112
    pages = _pages(torch, 12, 16)
    safe = torch.where(table >= 12, -1, table)
    w = torch.randn(10, 4)
    offsets = run_offsets(req)
    queries = {1: (torch.float32, indexer_decode.DOT_FP32), 2: (torch.float32, indexer_decode.DOT_FP32),
               3: (torch.float16, indexer_decode.DOT_BF16), 4: (torch.float8_e4m3fn, indexer_decode.DOT_BF16),
               5: (torch.float32, indexer_decode.DOT_FP32), 6: (torch.float32, indexer_decode.DOT_FP32)}
    # (tokens per segment, tiles per program, tile loop): the four loop forms, 1 to 8 tokens
    shapes = ((5, 2, 1), (1, 3, 0), (8, 2, 2), (3, 3, 3))
    for mode in MODES:
        q_dtype, dot = queries[mode]
        q = (torch.randn(10, 4, 128) * 2).to(q_dtype)
        want = reference(q.float(), w, pages, safe, req, pos, "mxfp4", width)
        finite = torch.isfinite(want)
        results[f"case_has_both_{mode}"] = bool(finite.any()) and bool((~finite).any())
        worst, same = 0.0, True
        for group, tiles, loop in (shapes if mode in (2, 5) else shapes[:1]):
            got = indexer_decode.launch(q, w, pages, table, req, pos, offsets, "mxfp4", width,
                                        torch.full((10, width), 7.0), dot=dot, block_n=16, group=group,
                                        tiles=tiles, loop=loop, mxfp4_mode=mode)
            same &= torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
            err = float((got[finite].double() - want[finite].double()).norm() / want[finite].double().norm())
            worst = max(worst, err)
        results[f"mode_{mode}_err"] = f"{worst:.3e}"
        results[f"mode_{mode}_mask"] = same
    # mode 3 on bf16 queries of any magnitude: each token's rows at its own scale (2^±100 and 1e6 overflow fp16,
    # 1e-6 is subnormal there), compared token by token (the scale of one would hide another's error); mode 4 on the
    # same queries with alu flag 128 (each row split into e4m3 hi + lo at its own scale, two FP8 MMAs a block), with
    # and without the word loads (flags 8 + 4)
    magnitude = torch.tensor([1.0, 1e6, 1e-6, 2.0 ** 100, 2.0 ** -100, 3e4, 1.0, 1e-30, 7.0, 1e20]).view(10, 1, 1)
    qb = (torch.randn(10, 4, 128) * magnitude).to(torch.bfloat16)
    want = reference(qb.float(), w, pages, safe, req, pos, "mxfp4", width)
    finite = torch.isfinite(want)
    for label, mode, alu in (("mode_3_bf16_magnitudes", 3, 0), ("mode_4_hi_lo_128", 4, 128),
                             ("mode_4_hi_lo_140", 4, 140)):
        got = indexer_decode.launch(qb, w, pages, table, req, pos, offsets, "mxfp4", width,
                                    torch.full((10, width), 7.0), dot=indexer_decode.DOT_BF16, block_n=16, group=5,
                                    tiles=2, loop=1, mxfp4_mode=mode, alu=alu)
        worst = 0.0
        for t in range(10):
            row = finite[t]
            if row.any():
                ref = want[t, row].double()
                worst = max(worst, float((got[t, row].double() - ref).norm() / ref.norm().clamp_min(1e-300)))
        results[f"{label}_mask"] = torch.equal(torch.isfinite(got), finite)
        results[f"{label}_err"] = f"{worst:.3e}"
    # mode 4 with flag 128 on a query row holding Inf or NaN: that token's visible scores are NaN, its masked ones
    # -inf (the e4m3 parts would have hidden them), the other tokens' as the reference's
    bad = qb.clone()
    bad[1, 2, 40] = float("inf")
    bad[4, 3, 99] = float("nan")
    got = indexer_decode.launch(bad, w, pages, table, req, pos, offsets, "mxfp4", width, torch.full((10, width), 7.0),
                                dot=indexer_decode.DOT_BF16, block_n=16, group=5, tiles=2, loop=1, mxfp4_mode=4,
                                alu=140)
    results["mode_4_hi_lo_nonfinite"] = all(
        bool(torch.isnan(got[t][finite[t]]).all()) and bool(torch.isneginf(got[t][~finite[t]]).all())
        and bool(finite[t].any()) for t in (1, 4)) and all(
        float((got[t, finite[t]].double() - want[t, finite[t]].double()).norm()
              / want[t, finite[t]].double().norm().clamp_min(1e-300)) < TOL for t in (0, 2, 3) if finite[t].any())
    # batch invariance: request 0's rows alone equal its rows inside the batch, bit for bit
    q8 = torch.randn(10, 4, 128).to(torch.float8_e4m3fn)
    mine = torch.tensor([1, 2, 3, 4, 5])
    kwargs = dict(dot=indexer_decode.DOT_BF16, block_n=16, group=5, tiles=2, loop=1, mxfp4_mode=4)
    full = indexer_decode.launch(q8, w, pages, table, req, pos, offsets, "mxfp4", width, torch.empty(10, width),
                                 **kwargs)
    alone = indexer_decode.launch(q8[mine], w[mine], pages, table, req[mine], pos[mine], run_offsets(req[mine]),
                                  "mxfp4", width, torch.empty(5, width), **kwargs)
    results["batch_invariant"] = torch.equal(full[mine], alone)


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_mode_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("mode", MODES)
def test_mxfp4_mode_matches_the_float64_reference(interpreted, mode):
    assert interpreted[f"case_has_both_{mode}"]
    assert interpreted[f"mode_{mode}_mask"], "the -inf mask (unmapped blocks, causal bound) differs"
    assert float(interpreted[f"mode_{mode}_err"]) < TOL, interpreted[f"mode_{mode}_err"]


def test_fp16_mode_scales_bf16_queries_of_any_magnitude_into_range(interpreted):
    """Mode 3 rounds the queries to fp16: without each row's power of two, 1e6 or 2^100 overflow to inf and
    1e-6 loses bits to subnormals."""
    assert interpreted["mode_3_bf16_magnitudes_mask"]
    assert float(interpreted["mode_3_bf16_magnitudes_err"]) < TOL, interpreted["mode_3_bf16_magnitudes_err"]


@pytest.mark.parametrize("alu", [128, 140])
def test_fp8_mode_takes_bf16_queries_split_into_two_e4m3_parts(interpreted, alu):
    """Mode 4 with alu flag 128: bf16 queries of any magnitude (2^+-100, 1e20, 1e-30) as e4m3 hi + lo, exact."""
    assert interpreted[f"mode_4_hi_lo_{alu}_mask"]
    assert float(interpreted[f"mode_4_hi_lo_{alu}_err"]) < TOL, interpreted[f"mode_4_hi_lo_{alu}_err"]


def test_fp8_mode_on_split_queries_holding_inf_or_nan_gives_non_finite_scores(interpreted):
    assert interpreted["mode_4_hi_lo_nonfinite"]


def test_mxfp4_mode_is_batch_invariant(interpreted):
    assert interpreted["batch_invariant"]


def test_mxfp4_mode_arguments_are_checked():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d

    ids = torch.zeros(2, dtype=torch.int32)
    qb = torch.zeros(2, 4, 128, dtype=torch.bfloat16)

    def launch(q, fmt, width_bytes, **kwargs):
        d.launch(q, torch.zeros(2, 4), torch.zeros(2, 16, width_bytes, dtype=torch.uint8),
                 torch.zeros(1, 2, dtype=torch.int32), ids, ids, ids, fmt, 32, torch.empty(2, 32), dot=d.DOT_BF16,
                 block_n=16, **kwargs)

    with pytest.raises(ValueError, match=r"indexer_score: mxfp4_mode must be one of \[0, 1, 2, 3, 4, 5, 6\].* got 7"):
        launch(qb, "mxfp4", 68, mxfp4_mode=7)
    with pytest.raises(ValueError, match=r"indexer_score: mxfp4_mode 2 .* decodes MXFP4 keys, got index_fmt='fp8'"):
        launch(qb, "fp8", 132, mxfp4_mode=2)
    with pytest.raises(ValueError, match=r"indexer_score: mxfp4_mode 5 .* excludes tl.dot_scaled .* got scaled_dot=1"):
        launch(qb, "mxfp4", 68, mxfp4_mode=5, scaled_dot=1)
    with pytest.raises(ValueError, match=r"indexer_score: mxfp4_mode 4 .* FP8 queries .*alu flag 128.*got q of dtype "
                                         r"torch.bfloat16 with alu=0"):
        launch(qb, "mxfp4", 68, mxfp4_mode=4)
    with pytest.raises(ValueError, match=r"indexer_score: mxfp4_mode 4 .* got q of dtype torch.float32 with alu=128"):
        launch(qb.float(), "mxfp4", 68, mxfp4_mode=4, alu=128)
    with pytest.raises(ValueError, match=r"indexer_score: alu flag 128 .* got alu=128 with q of dtype torch.bfloat16, "
                                         r"index_fmt='mxfp4', mxfp4_mode=3"):
        launch(qb, "mxfp4", 68, mxfp4_mode=3, alu=128)


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
