"""The instruction-count options of the block-tile indexer on FP8 keys (``indexer_decode.ALU_FLAGS``,
launcher ``alu``) against the float64 reference, under ``TRITON_INTERPRET=1`` on the CPU.

Each flag changes how a key tile is loaded or addressed (int32 words split into bytes in-thread, the MMA
register layout as a 5-D load, no division when a tile is a whole block), never the arithmetic: the
scores must match the reference like the default path's. The kernel runs with exact fp32 dots
(``DOT_FP32``) and with FP8 queries (FP8 MMA, exact in the interpreter) on random keys, queries and
weights, with an unmapped and an out-of-range block, causal bounds mid-tile, segments of 1, 2 and 5
tokens, a pool view whose block stride is larger than the block, and 16-, 32- and 64-key tiles.
"""
from __future__ import annotations

import json

import pytest

from indexer_cases import paged_case
from interpreter_child import child_results, run_groups

TOL = 1e-5  # relative (norm) error vs the float64 reference; exact keys, fp32 accumulation


def _compare(got, want) -> bool:
    import torch

    finite = torch.isfinite(want)
    same_mask = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
    a, b = got[finite].double(), want[finite].double()
    return same_mask and float((a - b).norm() / b.norm().clamp_min(1e-30)) < TOL


def _pages(block_tokens, blocks, *, pad_tokens=0):
    """``[blocks, block_tokens, 132]`` FP8 pages of random keys (scales vary per key); with ``pad_tokens``, a
    view into a pool whose blocks hold that many more random records (block stride > block)."""
    import torch

    from dsahal.formats import index_format

    dense = torch.randn(blocks * block_tokens, 128) * (torch.rand(blocks * block_tokens, 1) * 3 + 0.1)
    pages = index_format("fp8").pack(dense).view(blocks, block_tokens, -1)
    if not pad_tokens:
        return pages
    pool = torch.randint(0, 256, (blocks + 2, block_tokens + pad_tokens, pages.shape[-1]), dtype=torch.uint8)
    view = pool[1:1 + blocks, :block_tokens]
    view.copy_(pages)
    return view


def _alu_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.reference.indexer import indexer_score as reference

    for block_tokens in (16, 32, 64):
        table, req, pos = paged_case(block_tokens)
        width = 4 * block_tokens - 3  # not a multiple of the tile: the last tile is partly past the output
        offsets = run_offsets(req)
        for pad in (0, 4):
            pages = _pages(block_tokens, 8, pad_tokens=pad)
            safe = torch.where(table >= 8, -1, table)
            q = torch.randn(8, 4, 128)
            w = torch.randn(8, 4)
            q8 = (q * 4).to(torch.float8_e4m3fn)
            want = reference(q, w, pages, safe, req, pos, "fp8", width)
            want8 = reference(q8.float(), w, pages, safe, req, pos, "fp8", width)
            results[f"case_has_both_{block_tokens}_{pad}"] = bool(torch.isfinite(want).any()) and bool(
                torch.isinf(want).any())
            # (alu, group, loop, tiles): every flag alone and combined, the four loop forms, 1/2/5-token segments
            runs = [(1, 5, 1, 2), (2, 5, 1, 2), (3, 2, 1, 3), (4, 1, 0, 2), (5, 5, 3, 2), (6, 5, 2, 2),
                    (7, 5, 1, 2), (7, 1, 1, 4), (7, 2, 0, 3)]
            if block_tokens == 64:  # the interpreter is slow on 64-key tiles: the flags the sweep times
                runs = [(5, 5, 1, 2), (7, 5, 1, 2), (6, 1, 2, 2)]
            for alu, group, loop, tiles in runs:
                for label, query, dot, expect in (("fp32", q, d.DOT_FP32, want), ("fp8q", q8, d.DOT_FP8, want8)):
                    out = torch.full((8, width), float("nan"))  # an unwritten score stays NaN and fails
                    got = d.launch(query, w, pages, table, req, pos, offsets, "fp8", width, out, dot=dot,
                                   block_n=block_tokens, group=group, tiles=tiles, loop=loop, alu=alu)
                    results[f"{label}_b{block_tokens}_pad{pad}_alu{alu}_g{group}_l{loop}"] = _compare(got, expect)
            # flag 32: bf16 queries as fp16 MMAs, every token at its own magnitude (1e6 and 2^100 overflow fp16
            # unscaled, 1e-6 and 2^-100 fall to its subnormals), with the other flags; compared token by token
            magnitude = torch.tensor([1.0, 1e6, 1e-6, 2.0 ** 100, 2.0 ** -100, 3e4, 7.0, 1e20]).view(8, 1, 1)
            qb = (q * magnitude).to(torch.bfloat16)
            want_b = reference(qb.float(), w, pages, safe, req, pos, "fp8", width)
            f16_runs = ((32, 5, 1, 2), (37, 5, 1, 2), (33, 2, 0, 3), (38, 1, 2, 2))
            for alu, group, loop, tiles in (f16_runs if block_tokens == 16 else f16_runs[1:2]):  # (interpreter time)
                out = torch.full((8, width), float("nan"))
                got = d.launch(qb, w, pages, table, req, pos, offsets, "fp8", width, out, dot=d.DOT_BF16,
                               block_n=block_tokens, group=group, tiles=tiles, loop=loop, alu=alu)
                results[f"f16_b{block_tokens}_pad{pad}_alu{alu}"] = all(
                    _compare(got[t:t + 1], want_b[t:t + 1]) for t in range(8))
            # flag 128: the same bf16 queries as two FP8 MMAs on e4m3 hi + lo parts (each row at its own scale)
            hi_lo_runs = ((128, 5, 1, 2), (133, 5, 1, 2), (131, 2, 0, 3), (198, 1, 2, 2), (197, 1, 1, 2))
            for alu, group, loop, tiles in (hi_lo_runs if block_tokens == 16 else hi_lo_runs[1:2]):
                out = torch.full((8, width), float("nan"))
                got = d.launch(qb, w, pages, table, req, pos, offsets, "fp8", width, out, dot=d.DOT_BF16,
                               block_n=block_tokens, group=group, tiles=tiles, loop=loop, alu=alu)
                results[f"hilo_b{block_tokens}_pad{pad}_alu{alu}_g{group}"] = all(
                    _compare(got[t:t + 1], want_b[t:t + 1]) for t in range(8))
            if block_tokens == 16 and pad == 0:
                # an Inf or a NaN in a head's query row: that token's visible scores are not finite (the e4m3 parts
                # would saturate to 448 and hide it), its masked ones -inf, the other tokens' unchanged
                bad = qb.clone()
                bad[1, 2, 5] = float("inf")
                bad[3, 0, 7] = float("nan")
                out = torch.full((8, width), 7.0)
                got = d.launch(bad, w, pages, table, req, pos, offsets, "fp8", width, out, dot=d.DOT_BF16,
                               block_n=block_tokens, group=5, tiles=2, loop=1, alu=197)
                visible = torch.isfinite(want_b)
                results["nonfinite_rows"] = all(
                    bool(torch.isnan(got[t][visible[t]]).all()) and bool(torch.isneginf(got[t][~visible[t]]).all())
                    and bool(visible[t].any()) for t in (1, 3))
                results["nonfinite_others"] = all(_compare(got[t:t + 1], want_b[t:t + 1]) for t in (0, 2, 4, 5, 6, 7))


def _config_cases(results):
    """Through ``indexer_score`` with a configuration naming ``alu=5`` for every call (as the nvidia backend's
    does): flag 4 is dropped where a key tile is not one whole cache block (16-key tiles in 32-token blocks),
    kept where it is, and MXFP4 keys take none of the flags; each result against the reference."""
    import torch

    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    for block_tokens, fmt, per_request, q_kind in ((32, "fp8", False, "fp8"), (16, "fp8", False, "fp8"),
                                                   (16, "mxfp4", False, "fp8"), (32, "fp8", True, "fp8"),
                                                   (32, "fp8", False, "bf16")):
        table, req, pos = paged_case(block_tokens)
        table = torch.where(table >= 8, -1, table)
        width = 4 * block_tokens - 3
        if fmt == "fp8":
            pages = _pages(block_tokens, 8)
        else:
            pages = index_format("mxfp4").pack(torch.randn(8 * block_tokens, 128) + 1e-3).view(8, block_tokens, -1)
        q = (torch.randn(8, 4, 128) * 4).to(torch.float8_e4m3fn if q_kind == "fp8" else torch.bfloat16)
        w = torch.randn(8, 4)
        # group_per_request: 8 tokens over 3 block-table rows -> segments of at most 3, so request 0's run of 5
        # is split in two segments. alu 133: flag 128 (bf16 queries as e4m3 hi + lo) is dropped for FP8 queries
        # and MXFP4 keys outside mxfp4_mode 4, kept for bf16 queries on FP8 keys
        tiles = dict(block_n=16, tile_group=5, tiles=2, tile_loop=1, num_warps=4, num_stages=1, alu=133,
                     group_per_request=per_request)
        got = indexer_score(q, w, pages, table, req, pos, fmt, width, block_n=16, group=2, tiles=2,
                            block_tiles=tiles, mxfp4_dot_scaled=True)
        want = reference(q.float(), w, pages, table, req, pos, fmt, width)
        results[f"cfg_{fmt}_b{block_tokens}{'_per_request' if per_request else ''}"
                f"{'_bf16q' if q_kind == 'bf16' else ''}"] = _compare(got, want)


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_alu_cases, _config_cases))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_fp16_mmas_on_bf16_queries_of_any_magnitude_match_the_reference(interpreted):
    checks = {k: v for k, v in interpreted.items() if k.startswith("f16_")}
    assert len(checks) == 2 * (4 + 1 + 1), sorted(checks)
    failed = sorted(k for k, v in checks.items() if not v)
    assert not failed, failed


def test_two_fp8_mmas_on_split_bf16_queries_of_any_magnitude_match_the_reference(interpreted):
    checks = {k: v for k, v in interpreted.items() if k.startswith("hilo_")}
    assert len(checks) == 2 * (5 + 1 + 1), sorted(checks)
    failed = sorted(k for k, v in checks.items() if not v)
    assert not failed, failed


def test_split_bf16_queries_holding_inf_or_nan_give_non_finite_scores(interpreted):
    assert interpreted["nonfinite_rows"] and interpreted["nonfinite_others"], interpreted


def test_every_alu_variant_matches_the_reference(interpreted):
    checks = {k: v for k, v in interpreted.items()
              if not k.startswith(("case_", "cfg_", "f16_", "hilo_", "nonfinite_"))}
    assert len(checks) == 2 * 2 * (9 + 9 + 3), sorted(checks)
    failed = sorted(k for k, v in checks.items() if not v)
    assert not failed, failed


def test_a_configured_alu_is_kept_to_what_each_call_takes(interpreted):
    configured = {k: v for k, v in interpreted.items() if k.startswith("cfg_")}
    assert sorted(configured) == ["cfg_fp8_b16", "cfg_fp8_b32", "cfg_fp8_b32_bf16q", "cfg_fp8_b32_per_request",
                                  "cfg_mxfp4_b16"], configured
    assert all(configured.values()), configured


def test_fitting_alu_keeps_what_the_call_takes():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels.indexer_decode import DOT_BF16, DOT_FP8, _check_alu, fitting_alu

    bf16, fp8 = DOT_BF16, DOT_FP8
    cases = [  # (configured, fmt, block_n, block_tokens, mxfp4_mode, dot) -> expected
        ((5, "fp8", 64, 64, 0, fp8), 5), ((5, "fp8", 64, 128, 0, fp8), 1), ((7, "mxfp4", 64, 64, 0, bf16), 4),
        ((28, "mxfp4", 64, 64, 4, bf16), 28), ((28, "mxfp4", 64, 64, 0, bf16), 4), ((28, "fp8", 64, 64, 0, fp8), 4),
        ((16, "mxfp4", 64, 64, 4, bf16), 0), ((31, "mxfp4", 32, 64, 2, bf16), 24), ((0, "fp8", 64, 64, 0, fp8), 0),
        ((37, "fp8", 64, 64, 0, bf16), 37), ((37, "fp8", 64, 64, 0, fp8), 5), ((44, "mxfp4", 64, 64, 3, bf16), 12),
    ]
    for (alu, fmt, block_n, block_tokens, mode, dot), want in cases:
        got = fitting_alu(alu, fmt, block_n, block_tokens, mode, dot=dot)
        assert got == want, (alu, fmt, block_n, block_tokens, mode, dot, got)
        _check_alu(got, fmt, block_n, block_tokens, mode, dot)  # what it keeps, the launcher accepts
    # flag 128 (bf16 queries as e4m3 hi + lo): bf16 q on FP8 keys, or on MXFP4 keys in mode 4; never with flag 32
    b, f8 = torch.bfloat16, torch.float8_e4m3fn
    cases = [  # (configured, fmt, block_tokens, mxfp4_mode, dot, q dtype) -> expected
        ((197, "fp8", 64, 0, bf16, b), 197), ((197, "fp8", 64, 0, fp8, f8), 69), ((197, "fp8", 128, 0, bf16, b), 193),
        ((140, "mxfp4", 64, 4, bf16, b), 140), ((140, "mxfp4", 64, 4, bf16, f8), 12), ((140, "mxfp4", 64, 3, bf16, b), 12),
        ((160, "fp8", 64, 0, bf16, b), 32), ((133, "fp8", 64, 0, bf16, None), 133), ((140, "mxfp4", 64, 4, bf16, None), 12),
    ]
    for (alu, fmt, block_tokens, mode, dot, q_dtype), want in cases:
        got = fitting_alu(alu, fmt, 64, block_tokens, mode, dot=dot, q_dtype=q_dtype)
        assert got == want, (alu, fmt, block_tokens, mode, dot, q_dtype, got)
        _check_alu(got, fmt, 64, block_tokens, mode, dot, q_dtype)


def test_the_cases_hold_visible_and_masked_scores(interpreted):
    cases = {k: v for k, v in interpreted.items() if k.startswith("case_")}
    assert len(cases) == 6 and all(cases.values()), cases


def test_alu_flags_that_do_not_fit_are_refused():
    import torch

    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels import indexer_decode as d

    table, req, pos = paged_case(32)
    pages = torch.zeros(8, 32, 132, dtype=torch.uint8)
    q8 = torch.zeros(8, 4, 128).to(torch.float8_e4m3fn)
    w = torch.zeros(8, 4)
    args = (q8, w, pages, table, req, pos, torch.zeros_like(req), "fp8", 125, torch.empty(8, 125))
    with pytest.raises(ValueError, match="alu must be an int in 0..255"):
        d.launch(*args, dot=d.DOT_FP8, block_n=32, alu=256)
    with pytest.raises(ValueError, match="alu flag 128 .* bf16 queries on FP8 keys .* got alu=128 with q of dtype "
                                         "torch.float8_e4m3fn, index_fmt='fp8'"):
        d.launch(*args, dot=d.DOT_FP8, block_n=32, alu=128)
    qb = torch.zeros(8, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="alu flags 32 and 128 .* got both"):
        d.launch(qb, *args[1:], dot=d.DOT_BF16, block_n=32, alu=160)
    with pytest.raises(ValueError, match="alu flag 32 .* bf16 queries on FP8 keys .* got alu=32 with index_fmt='fp8', dot=1"):
        d.launch(*args, dot=d.DOT_FP8, block_n=32, alu=32)
    with pytest.raises(ValueError, match="alu must be an int"):
        d.launch(*args, dot=d.DOT_FP8, block_n=32, alu=True)
    with pytest.raises(ValueError, match="16-key tiles in 32-token blocks"):
        d.launch(*args, dot=d.DOT_FP8, block_n=16, alu=4)
    mx = torch.zeros(8, 32, 68, dtype=torch.uint8)
    with pytest.raises(ValueError, match="index_fmt='mxfp4'"):
        d.launch(q8, w, mx, table, req, pos, torch.zeros_like(req), "mxfp4", 125, torch.empty(8, 125),
                 dot=d.DOT_BF16, block_n=32, alu=3)


def test_inline_ptx_runs_on_nvidia_cuda_devices_only(monkeypatch):
    """The L2 hint and alu flag 64's stores are PTX: CPU launches (the interpreter) and ROCm builds, whose devices
    torch also calls ``cuda``, must take the plain paths."""
    import torch

    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels import indexer_decode as d

    monkeypatch.setattr(torch.version, "hip", None)
    assert d.runs_ptx(torch.device("cuda", 0)) and not d.runs_ptx(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert not d.runs_ptx(torch.device("cuda", 0))


if __name__ == "__main__":
    print(json.dumps(_run_all()))
