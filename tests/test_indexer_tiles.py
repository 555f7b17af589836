"""The block-tile indexer path (``backends/triton_kernels/indexer_decode.py``) against the float64
reference, under ``TRITON_INTERPRET=1`` on the CPU.

All launches run once in a subprocess that sets ``TRITON_INTERPRET=1`` before triton is imported; each
test asserts one behaviour from its result. The interpreter's bf16 dots are wrong, so the kernel runs
here with exact fp32 dots (``dot=DOT_FP32``, which the launcher never picks) or FP8 queries (FP8 MMA,
exact in the interpreter; MXFP4 keys through ``tl.dot_scaled``); the bf16 MMAs are checked on the H200
by ``scripts/h200/indexer_sweep.py``.
"""
from __future__ import annotations

import json

import pytest

from interpreter_child import child_results, run_groups

TOL = 1e-5  # relative (norm) error vs the float64 reference; exact keys, fp32 accumulation


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _case():
    """Three requests with 1, 5 and 3 tokens (request 0's run split by request 2: runs of 2 and 1 more),
    positions ending mid-tile, unmapped (-1) and out-of-range (999) blocks, 16-token blocks."""
    import torch

    table = torch.tensor([[3, 1, 0, 7, -1, 5, 9],
                          [2, 4, 6, 8, 999, 10, 11],
                          [11, -1, 0, 5, 6, 1, 2]], dtype=torch.int32)
    req = torch.tensor([1, 0, 0, 0, 0, 0, 2, 2, 0, 2], dtype=torch.int32)
    pos = torch.tensor([70, 20, 37, 38, 39, 95, 5, 99, 52, 100], dtype=torch.int32)
    return table, req, pos


def _pool_view(pages, *, offset_blocks, block_pad_tokens):
    """The same records as a view into a bigger pool: ``offset_blocks`` blocks in, every block followed by
    ``block_pad_tokens`` spare records (block stride larger than the block); the spare bytes are random."""
    import torch

    blocks, tokens, width = pages.shape
    pool = torch.randint(0, 256, (blocks + 2 * offset_blocks, tokens + block_pad_tokens, width), dtype=torch.uint8)
    view = pool[offset_blocks:offset_blocks + blocks, :tokens]
    view.copy_(pages)
    return view


def _compare(got, want):
    import torch

    finite = torch.isfinite(want)
    same_mask = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
    return same_mask and _rel(got[finite], want[finite]) < TOL


def _tile_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode
    from dsahal.backends.triton_kernels.indexer import indexer_score, run_offsets
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    table, req, pos = _case()
    width = 112  # not a multiple of the tile: the last tile is partly past the output
    offsets = run_offsets(req)
    results["segment_starts"] = indexer_decode.segment_starts(offsets, 2).tolist() == [0, 1, 3, 5, 6, 8, 9] + [10] * 3
    for fmt in ("fp8", "mxfp4"):
        dense = torch.randn(12 * 16, 128) * torch.rand(12 * 16, 1) * 3
        pages = index_format(fmt).pack(dense).view(12, 16, -1)
        safe = torch.where(table >= 12, -1, table)
        q = torch.randn(10, 4, 128)
        w = torch.randn(10, 4)
        want = reference(q, w, pages, safe, req, pos, fmt, width)
        ok = bool(torch.isfinite(want).any()) and bool(torch.isinf(want).any())
        sources = {"packed": pages, "pool_view": _pool_view(pages, offset_blocks=3, block_pad_tokens=4)}
        for name, source in sources.items():
            ok_src = True
            # exact fp32 dots: tokens per segment 1, 2, 5, 8; tiles per program; the four loop forms;
            # 16-key tiles on 16-token blocks, and (block_n=64 asked) capped at the block
            for group, tiles, loop, block_n in ((1, 1, 0, 16), (2, 3, 1, 16), (5, 2, 2, 16), (8, 4, 1, 64),
                                                (3, 3, 3, 16)):
                out = torch.full((10, width), 7.0)
                got = indexer_decode.launch(q, w, source, table, req, pos, offsets, fmt, width, out,
                                            dot=indexer_decode.DOT_FP32, block_n=block_n, group=group, tiles=tiles,
                                            loop=loop)
                ok_src &= _compare(got, want)
            results[f"fp32_{fmt}_{name}"] = ok_src
        # FP8 queries through the public launcher (FP8 MMA on FP8 keys; tl.dot_scaled on MXFP4 keys)
        q8 = torch.randn(10, 4, 128).to(torch.float8_e4m3fn)
        want8 = reference(q8.float(), w, pages, safe, req, pos, fmt, width)
        ok8 = True
        for options in (dict(group=8, tiles=4), dict(group=2, tiles=2, pipeline=True), dict(tile_loop=1)):
            got = indexer_score(q8, w, sources["pool_view"], table, req, pos, fmt, width, block_n=16,
                                block_tiles=True, **options)
            ok8 &= _compare(got, want8)
        results[f"fp8q_{fmt}"] = ok8
        results[f"case_has_both_{fmt}"] = ok

    # tiles inside a bigger block (32-token blocks, 16-key tiles: the tile starts mid-block)
    dense = torch.randn(6 * 32, 128)
    pages = index_format("fp8").pack(dense).view(6, 32, -1)
    table32 = torch.tensor([[2, -1, 0, 5], [1, 3, 4, 9]], dtype=torch.int32)
    req32 = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    pos32 = torch.tensor([47, 100, 17, 70, 127], dtype=torch.int32)
    q = torch.randn(5, 4, 128)
    w = torch.randn(5, 4)
    want = reference(q, w, pages, torch.where(table32 >= 6, -1, table32), req32, pos32, "fp8", 128)
    got = indexer_decode.launch(q, w, pages, table32, req32, pos32, run_offsets(req32), "fp8", 128,
                                torch.empty(5, 128), dot=indexer_decode.DOT_FP32, block_n=16, group=3, tiles=3)
    results["tile_inside_block"] = _compare(got, want)

    # batch invariance: request 0's rows alone equal its rows inside the batch, bit for bit
    table, req, pos = _case()
    pages = index_format("fp8").pack(torch.randn(12 * 16, 128)).view(12, 16, -1)
    q8 = torch.randn(10, 4, 128).to(torch.float8_e4m3fn)
    w = torch.randn(10, 4)
    full = indexer_score(q8, w, pages, table, req, pos, "fp8", 112, block_n=16, block_tiles=True)
    mine = torch.tensor([1, 2, 3, 4, 5])  # request 0's run of five tokens
    alone = indexer_score(q8[mine], w[mine], pages, table, req[mine], pos[mine], "fp8", 112, block_n=16,
                          block_tiles=True)
    results["batch_invariant"] = torch.equal(full[mine], alone)

    # the general kernel still serves (and matches) when block tiles are off, on the same pages
    safe = torch.where(table >= 12, -1, table)
    want = reference(q8.float(), w, pages, safe, req, pos, "fp8", 112)
    ok = True
    for options in (dict(), dict(pipeline=True, typed_keys=True, tiles=2)):
        ok &= _compare(indexer_score(q8, w, pages, table, req, pos, "fp8", 112, block_n=16, group=2, **options),
                       want)
    results["general_kernel_without_block_tiles"] = ok


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_tile_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("source", ["packed", "pool_view"])
def test_block_tiles_match_reference_on_unmapped_blocks_and_mid_tile_positions(interpreted, fmt, source):
    assert interpreted[f"fp32_{fmt}_{source}"]


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_block_tiles_with_fp8_queries_through_the_launcher(interpreted, fmt):
    assert interpreted[f"fp8q_{fmt}"]


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_reference_case_has_visible_and_masked_scores(interpreted, fmt):
    assert interpreted[f"case_has_both_{fmt}"]


def test_segment_starts_list_live_segments_first(interpreted):
    assert interpreted["segment_starts"]


def test_tiles_may_start_inside_a_cache_block(interpreted):
    assert interpreted["tile_inside_block"]


def test_block_tiles_are_batch_invariant(interpreted):
    assert interpreted["batch_invariant"]


def test_general_kernel_serves_when_block_tiles_are_off(interpreted):
    assert interpreted["general_kernel_without_block_tiles"]


def test_block_tiles_serve_only_what_they_can_address():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d

    q8 = torch.zeros(2, 32, 128, dtype=torch.float8_e4m3fn)
    qb = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    fp8_pages = torch.zeros(4, 64, 132, dtype=torch.uint8)
    assert d.serves(q8, fp8_pages, "fp8", d.DOT_FP8, 64) and d.serves(qb, fp8_pages, "fp8", d.DOT_BF16, 64)
    assert d.serves(qb, torch.zeros(4, 64, 68, dtype=torch.uint8), "mxfp4", d.DOT_BF16, 64)
    unaligned = torch.zeros(4 * 64 * 132 + 1, dtype=torch.uint8)[1:].view(4, 64, 132)
    assert not d.serves(q8, unaligned, "fp8", d.DOT_FP8, 64)  # odd addresses: the general kernel's byte loads
    assert not d.serves(qb, torch.zeros(4, 64, 256, dtype=torch.uint8), "bf16", d.DOT_BF16, 64)
    assert not d.serves(torch.zeros(2, 32, 128), fp8_pages, "fp8", d.DOT_FP32, 64)  # exact fp32: general kernel
    strided_tokens = torch.zeros(4, 64, 136, dtype=torch.uint8)[:, :, :132]
    assert not d.serves(q8, strided_tokens, "fp8", d.DOT_FP8, 64)
    assert not d.serves(q8, torch.zeros(4, 24, 132, dtype=torch.uint8), "fp8", d.DOT_FP8, 64)  # 8-key tiles
    assert (d.tile_keys(64, 64), d.tile_keys(16, 64), d.tile_keys(128, 64), d.tile_keys(48, 64)) == (64, 16, 64, 16)
    with pytest.raises(ValueError, match=r"indexer_score: .* tokens per segment \(group\), got 9"):
        d.launch(qb, torch.zeros(2, 32), fp8_pages, torch.zeros(1, 4, dtype=torch.int32),
                 torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                 torch.zeros(2, dtype=torch.int32), "fp8", 64, torch.empty(2, 64), dot=d.DOT_BF16, group=9)
    with pytest.raises(ValueError, match=r"indexer_score: tile_loop must be .* got 4"):
        d.launch(qb, torch.zeros(2, 32), fp8_pages, torch.zeros(1, 4, dtype=torch.int32),
                 torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                 torch.zeros(2, dtype=torch.int32), "fp8", 64, torch.empty(2, 64), dot=d.DOT_BF16, loop=4)


def test_long_rows_keep_the_key_chunk_axis_within_the_cuda_grid_limit(monkeypatch):
    """Segments run on grid axis 0; key chunks on axis 1, which CUDA caps at 65535: a row longer than
    65535 chunks must get more tiles per program, not an unlaunchable grid."""
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((grid, meta))

    monkeypatch.setattr(d, "indexer_tiles_kernel", Recorder())
    width = 16 * 65535 * 3 + 5
    ids = torch.zeros(3, dtype=torch.int32)
    for tiles in (1, 8):
        d.launch(torch.zeros(3, 4, 128, dtype=torch.bfloat16), torch.zeros(3, 4),
                 torch.zeros(2, 16, 132, dtype=torch.uint8), torch.zeros(1, 2, dtype=torch.int32), ids, ids, ids,
                 "fp8", width, torch.empty(0), dot=d.DOT_BF16, block_n=16, group=2, tiles=tiles,
                 starts=torch.arange(3, dtype=torch.int32))  # given: the plan kernel needs a GPU or the interpreter
    (grid1, meta1), (grid8, meta8) = launched
    assert grid1[0] == 3 and grid1[1] <= 65535 and grid1[1] * 16 * meta1["TILES"] >= width
    assert grid8 == (3, -(-width // (16 * 8))) and meta8["TILES"] == 8


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
