"""The MXFP4 word decode of the block-tile indexer (``indexer_decode.ALU_FLAGS`` 8 and 16, with 4; launcher
``alu``, ``mxfp4_mode`` 2-4) against the float64 reference, under ``TRITON_INTERPRET=1`` on the CPU.

Flag 8 loads the packed pairs and the scale bytes as int32 words and decodes whole words; flag 16 keeps the
decoded bytes in word order and loads the queries in that order. Neither changes a key's value, so the
scores must match the reference like mode 4's / mode 2's byte path, and flag 8 alone (dims in order, the
same MMAs) must equal the byte path bit for bit. Keys are raw random records (every e2m1 code in both
nibbles, signed zeros included) with scale bytes spread over 2^-127 (byte 0, on every eighth key's second
block) .. 2^60, so every block of a key has its own power of two. Mode 4 runs with FP8 queries (FP8 MMAs,
exact in the interpreter), mode 2 with exact fp32 dots (the interpreter's bf16 dots are wrong). Cases: an
unmapped and an out-of-range block, causal bounds mid-tile, segments of 1, 2 and 5 tokens, the four tile
loops, 16-, 32- and 64-key tiles.
"""
from __future__ import annotations

import json

import pytest

from indexer_cases import paged_case
from interpreter_child import child_results, run_groups

TOL = 1e-5  # relative (norm) error vs the float64 reference: exact keys, fp32 accumulation


def _pages(torch, blocks, block_tokens):
    """``[blocks, block_tokens, 68]`` random MXFP4 records: scale bytes in 100..187, byte 0 on every eighth
    key's second block."""
    pages = torch.randint(0, 256, (blocks, block_tokens, 68), dtype=torch.uint8)
    pages[..., 64:] = torch.randint(100, 188, (blocks, block_tokens, 4), dtype=torch.uint8)
    pages[:, ::8, 65] = 0
    return pages


def _error(torch, got, want):
    """(relative norm error on the finite scores, whether the -inf mask is the reference's)."""
    finite = torch.isfinite(want)
    same = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
    a, b = got[finite].double(), want[finite].double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30)), same


def _word_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.reference.indexer import indexer_score as reference

    for block_tokens in (16, 32, 64):
        table, req, pos = paged_case(block_tokens)
        width = 4 * block_tokens - 3  # the last tile partly past the output
        offsets = run_offsets(req)
        pages = _pages(torch, 8, block_tokens)
        safe = torch.where(table >= 8, -1, table)
        w = torch.randn(8, 4)
        q32 = torch.randn(8, 4, 128) * 2
        q8 = q32.to(torch.float8_e4m3fn)
        wants = {4: reference(q8.float(), w, pages, safe, req, pos, "mxfp4", width),
                 2: reference(q32, w, pages, safe, req, pos, "mxfp4", width)}
        finite = torch.isfinite(wants[4])
        results[f"case_has_both_b{block_tokens}"] = bool(finite.any()) and bool((~finite).any())
        # (alu, group, loop, tiles): every flag set, the four loop forms, 1/2/5-token segments
        runs = [(8, 5, 1, 2), (24, 5, 1, 2), (12, 2, 0, 3), (28, 1, 3, 2), (28, 5, 2, 2), (24, 2, 3, 3)]
        if block_tokens == 64:  # the interpreter is slow on 64-key tiles: the flag sets the sweep times
            runs = [(12, 5, 1, 2), (28, 5, 1, 2), (24, 1, 0, 2)]
        for alu, group, loop, tiles in runs:
            for mode, query, dot in ((4, q8, d.DOT_BF16), (2, q32, d.DOT_FP32)):
                kwargs = dict(dot=dot, block_n=block_tokens, group=group, tiles=tiles, loop=loop, mxfp4_mode=mode)
                out = torch.full((8, width), float("nan"))  # an unwritten score stays NaN and fails
                got = d.launch(query, w, pages, table, req, pos, offsets, "mxfp4", width, out, alu=alu, **kwargs)
                err, same = _error(torch, got, wants[mode])
                name = f"m{mode}_b{block_tokens}_alu{alu}_g{group}_l{loop}"
                results[f"err_{name}"] = f"{err:.3e}"
                results[f"mask_{name}"] = same
                if alu & 16 == 0:  # dims in order: the byte path's MMAs on the same operands, bit for bit
                    base = d.launch(query, w, pages, table, req, pos, offsets, "mxfp4", width,
                                    torch.full((8, width), float("nan")), alu=alu & 4, **kwargs)
                    results[f"bits_{name}"] = torch.equal(got, base)


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_word_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_the_word_decode_matches_the_float64_reference(interpreted):
    errors = {k[4:]: float(v) for k, v in interpreted.items() if k.startswith("err_")}
    assert len(errors) == 2 * (6 + 6 + 3), sorted(errors)
    assert all(interpreted[f"mask_{name}"] for name in errors), \
        sorted(name for name in errors if not interpreted[f"mask_{name}"])
    worst = {name: err for name, err in errors.items() if not err < TOL}
    assert not worst, worst


def test_the_word_decode_in_dim_order_equals_the_byte_path_bit_for_bit(interpreted):
    bits = {k: v for k, v in interpreted.items() if k.startswith("bits_")}
    assert len(bits) == 2 * (2 + 2 + 1), sorted(bits)
    assert all(bits.values()), sorted(k for k, v in bits.items() if not v)


def test_the_cases_hold_visible_and_masked_scores(interpreted):
    cases = {k: v for k, v in interpreted.items() if k.startswith("case_")}
    assert len(cases) == 3 and all(cases.values()), cases


def test_word_flags_that_do_not_fit_are_refused():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d

    table, req, pos = paged_case(32)
    q8 = torch.zeros(8, 4, 128).to(torch.float8_e4m3fn)
    w = torch.zeros(8, 4)

    def launch(fmt, record, **kwargs):
        d.launch(q8, w, torch.zeros(8, 32, record, dtype=torch.uint8), table, req, pos, torch.zeros_like(req), fmt, 125,
                 torch.empty(8, 125), dot=d.DOT_BF16, block_n=32, **kwargs)

    with pytest.raises(ValueError, match=r"alu must be an int in 0\.\.255"):
        launch("mxfp4", 68, mxfp4_mode=4, alu=256)
    with pytest.raises(ValueError, match=r"alu flag 128 .* got alu=128 with q of dtype torch.float8_e4m3fn"):
        launch("mxfp4", 68, mxfp4_mode=4, alu=128)
    with pytest.raises(ValueError, match=r"alu flags 8 and 16 .* mxfp4_mode 2\.\.4, got alu=8 with index_fmt='fp8'"):
        launch("fp8", 132, alu=8)
    for mode in (0, 1, 5):
        with pytest.raises(ValueError, match=rf"alu flags 8 and 16 .* got alu=8 .* mxfp4_mode={mode}"):
            launch("mxfp4", 68, mxfp4_mode=mode, alu=8)
    with pytest.raises(ValueError, match=r"alu flag 16 .* got alu=16 without flag 8"):
        launch("mxfp4", 68, mxfp4_mode=4, alu=16)


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
