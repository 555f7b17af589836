"""The shared Triton kernels against the reference, under ``TRITON_INTERPRET=1`` on the CPU.

All kernels run once, in a subprocess that sets ``TRITON_INTERPRET=1`` before triton is imported
(so no other test's triton state is touched); each test below asserts one behaviour from its
result. The interpreter's bf16 arithmetic and its float->e4m3 rounding are wrong (FEASIBILITY.md),
so queries here are fp32/fp16/fp8 and cache bytes are compared with the interpreter's own e4m3
cast; the bf16 paths and the bitwise cache bytes are checked on the H200 (``dsahal bench``).
"""
from __future__ import annotations

import json

import pytest

from dsa_layer_case import small_layer_args
from interpreter_child import child_results, run_groups


def _unaligned(pages):
    """The same records in a pool that starts one byte in: every record at an odd address."""
    import torch

    pool = torch.zeros(pages.numel() + 1, dtype=torch.uint8)
    view = pool[1:].view(pages.shape)
    view.copy_(pages)
    return view


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _sparse_mla_cases(results):
    import torch

    from dsahal.backends.triton_kernels.sparse_mla import sparse_mla
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    for fmt in ("bf16", "fp8", "fp8_ds_mla", "nvfp4"):
        spec = latent_format(fmt)
        pages = spec.pack(torch.randn(6 * 16, 576) * 2, torch.tensor(0.03) if spec.needs_tensor_scale else None)
        pages = pages.view(6, 16, -1)
        scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
        q = torch.randn(4, 16, 576)
        slots = torch.randint(-1, 96, (4, 37), dtype=torch.int32)
        slots[3] = -1  # empty row
        slots[0, 5] = 96 + 1000  # out of range: skipped, never read
        safe = torch.where(slots >= 96, -1, slots)
        want_o, want_lse = reference(q, pages, safe, fmt, scale, 0.08)
        # the queries one element into rows of 577: unaligned start and strides (the launcher copies them)
        wide = torch.randn(4, 16, 577)
        wide[:, :, 1:] = q
        for split in (None, 16, "unaligned"):
            source = _unaligned(pages) if split == "unaligned" else pages
            ok = True
            for v_split in (1, 2, 4):  # the value columns in one program, or shared by two or four
                o, lse = sparse_mla(q, source, slots, fmt, scale, 0.08, block_h=16, block_n=16,
                                    split_size=16 if split == "unaligned" else split, v_split=v_split)
                finite = torch.isfinite(want_lse)
                ok &= (_rel(o, want_o) < 1e-5 and bool((lse[finite] - want_lse[finite]).abs().max() < 1e-4)
                       and bool(torch.isneginf(lse[3]).all()) and bool((o[3] == 0).all()))
            if split == "unaligned":
                o2, lse2 = sparse_mla(wide[:, :, 1:], source, slots, fmt, scale, 0.08, block_h=16, block_n=16,
                                      split_size=16)
                o1, lse1 = sparse_mla(q, source, slots, fmt, scale, 0.08, block_h=16, block_n=16, split_size=16)
                ok &= bool(torch.equal(o1, o2) and torch.equal(lse1, lse2))
            results[f"sparse_mla_{fmt}_split{split}"] = ok


def _indexer_cases(results):
    import torch

    from dsahal.backends.triton_kernels.indexer import indexer_score, run_offsets
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    table = torch.tensor([[3, 1, 0, 7, -1, 5], [2, 4, 6, 8, 999, 10]], dtype=torch.int32)  # -1 and 999 unmapped
    safe_table = torch.where(table >= 12, -1, table)
    req = torch.tensor([0, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.int32)
    pos = torch.tensor([50, 51, 95, 10, 70, 20, 71, 72, 95], dtype=torch.int32)
    results["indexer_run_offsets"] = run_offsets(req).tolist() == [0, 1, 2, 0, 1, 0, 0, 1, 2]
    for fmt in ("bf16", "fp8"):
        pages = index_format(fmt).pack(torch.randn(12 * 16, 128)).view(12, 16, -1)
        for q_dtype in (torch.float32, torch.float8_e4m3fn):
            if fmt == "bf16" and q_dtype == torch.float8_e4m3fn:
                continue  # widened to bf16: wrong under the interpreter, checked on the GPU
            q = torch.randn(9, 4, 128).to(q_dtype)
            w = torch.randn(9, 4)
            want = reference(q.float(), w, pages, safe_table, req, pos, fmt, 100)
            finite = torch.isfinite(want)
            ok = True
            # the unrolled loop, and the rolled (pipelinable) loop with keys as either MMA operand
            variants = (dict(), dict(pipeline=True, typed_keys=True), dict(pipeline=True, typed_keys=True,
                                                                            keys_as_b=True))
            # 16-key tiles on 16-token blocks: a tile is one cache block (one table lookup per tile), or
            # addressed key by key as any other tile shape
            variants += tuple(dict(v, block_n=16, one_block_tiles=one) for v in variants[:2] for one in (True, False))
            for source in (pages, _unaligned(pages)):
                for variant in variants:
                    got = indexer_score(q, w, source, table, req, pos, fmt, 100, **{
                        "block_n": 32, "group": 2, "tiles": 2, **variant})
                    ok &= torch.equal(torch.isfinite(got), finite) and _rel(got[finite], want[finite]) < 1e-5
            results[f"indexer_{fmt}_{str(q_dtype).split('.')[-1]}"] = ok


def _topk_cases(results):
    import torch

    from dsahal.backends.triton_kernels.slots import positions_to_slots
    from dsahal.backends.triton_kernels.topk import topk
    from dsahal.reference.topk import topk as reference

    scores = torch.randn(6, 300)
    scores[1] = torch.randint(0, 4, (300,)).float()  # heavy ties at the boundary
    scores[2, 100:] = float("-inf")
    scores[3] = -0.0
    scores[3, ::2] = 0.0  # -0.0 and +0.0 are equal
    scores[4, :] = 1.5  # one value everywhere: the first k indices win
    lengths = torch.tensor([300, 300, 300, 250, 300, 7], dtype=torch.int32)
    exact = True
    for k in (1, 17, 64, 400):
        for row_levels in (1, 2):
            got = topk(scores, lengths, k, chunk=64, row_levels=row_levels)
            want = reference(scores, lengths, k)
            exact &= torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    results["topk_exact_tie_rule"] = exact
    split_same = True  # several programs per row: the same output, bit for bit, order included
    for k in (17, 296):
        single = topk(scores, lengths, k, chunk=32)
        split = topk(scores, lengths, k, chunk=32, segments=3)
        split_same &= torch.equal(split, single) and torch.equal(
            split.sort(dim=1).values, reference(scores, lengths, k).sort(dim=1).values)
    results["topk_split_rows_exact"] = split_same
    table = torch.tensor([[3, 1, 0, -1], [2, 4, 6, 5]], dtype=torch.int32)
    req = torch.tensor([0, 1, 1, 0, 1, 0], dtype=torch.int32)
    row_scores = torch.randn(6, 64)
    lens = torch.full((6,), 64, dtype=torch.int32)
    positions = topk(row_scores, lens, 20, chunk=32)
    slots = topk(row_scores, lens, 20, chunk=32, emit_slots=(req, table, 16))
    results["topk_emits_slots"] = torch.equal(slots, positions_to_slots(positions, req, table, 16))

    from dsahal.backends.nvidia.collectives import topk_merge

    merged = topk_merge(scores, lengths, 64, None)  # one rank: must equal the single-device top-k
    results["topk_merge_single_rank"] = torch.equal(merged.sort(dim=1).values,
                                                    reference(scores, lengths, 64).sort(dim=1).values)


def _small_op_cases(results):
    import torch

    from dsahal.backends.triton_kernels.lse_combine import lse_combine
    from dsahal.backends.triton_kernels.slots import positions_to_slots
    from dsahal.reference.lse_combine import lse_combine as ref_lse
    from dsahal.reference.slots import positions_to_slots as ref_slots

    table = torch.tensor([[3, 1, 0, -1], [2, 4, 6, 5]], dtype=torch.int32)
    positions = torch.randint(-1, 64, (5, 30), dtype=torch.int32)
    req = torch.tensor([0, 1, 1, 0, 1], dtype=torch.int32)
    results["positions_to_slots"] = torch.equal(positions_to_slots(positions, req, table, 16),
                                                ref_slots(positions, req, table, 16))
    o_parts, lse_parts = torch.randn(3, 4, 2, 40), torch.randn(3, 4, 2)
    lse_parts[:, 0, 0] = float("-inf")
    lse_parts[1, 1, 1] = float("-inf")
    o, lse = lse_combine(o_parts, lse_parts)
    o_ref, lse_ref = ref_lse(o_parts, lse_parts)
    results["lse_combine"] = (_rel(o, o_ref) < 1e-6 and torch.allclose(lse, lse_ref, equal_nan=True)
                              and bool((o[0, 0] == 0).all()))
    # a dead part's output is never read into the sum (the wgmma kernels' balanced schedule leaves a row's unused
    # parts unwritten, lse -inf): NaN and Inf there change nothing
    garbage = o_parts.clone()
    garbage[1, 1, 1] = float("nan")
    garbage[:, 0, 0] = float("inf")
    o_g, lse_g = lse_combine(garbage, lse_parts)
    results["lse_combine_dead_parts_unread"] = bool(torch.equal(o_g, o) and torch.equal(lse_g, lse))


def _kda_cases(results):
    import torch

    from dsahal.backends.triton_kernels.kda import kda_decode, kda_prefill_recurrent
    from dsahal.reference import kda as reference

    heads, dim = 2, 32
    for dtype in (torch.float32, torch.float16):
        q, k, v = (torch.randn(3, heads, dim).to(dtype) for _ in range(3))
        g, beta = -torch.rand(3, heads, dim), torch.rand(3, heads)
        pool = torch.randn(5, heads, dim, dim)
        ids = torch.tensor([4, -1, 1], dtype=torch.int32)
        a, b = pool.clone(), pool.clone()
        o = kda_decode(q, k, v, g, beta, a, ids, dim**-0.5, True, block_v=16)
        o_ref = reference.kda_decode(q, k, v, g, beta, b, ids, dim**-0.5, True)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        results[f"kda_decode_{str(dtype).split('.')[-1]}"] = (_rel(o, o_ref) < tol and _rel(a, b) < 1e-5
                                                               and bool((o[1] == 0).all()))
    cu = torch.tensor([0, 7, 7, 20], dtype=torch.int32)
    q, k, v = (torch.randn(20, heads, dim) for _ in range(3))
    g, beta = -torch.rand(20, heads, dim), torch.rand(20, heads)
    pool = torch.randn(5, heads, dim, dim)
    ids = torch.tensor([4, 2, -1], dtype=torch.int32)
    a, b = pool.clone(), pool.clone()
    o = kda_prefill_recurrent(q, k, v, g, beta, cu, a, ids, dim**-0.5, True, block_v=16)
    o_ref = reference.kda_prefill(q, k, v, g, beta, cu, b, ids, dim**-0.5, True)
    results["kda_prefill_recurrent"] = _rel(o, o_ref) < 1e-5 and _rel(a, b) < 1e-5


def _cache_write_cases(results):
    import torch
    import triton
    import triton.language as tl

    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.formats import cache_format

    @triton.jit
    def to_e4m3(x_ptr, out_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv).to(tl.uint8, bitcast=True))

    def interpreter_e4m3(x):
        flat = x.reshape(-1).contiguous()
        size = triton.next_power_of_2(flat.numel())
        padded = torch.zeros(size)
        padded[: flat.numel()] = flat
        out = torch.empty(size, dtype=torch.uint8)
        to_e4m3[(1,)](padded, out, N=size)
        return out[: flat.numel()].view(x.shape)

    for kind, fmt in (("index", "fp8"), ("latent", "fp8"), ("latent", "fp8_ds_mla")):
        spec = cache_format(kind, fmt)
        values = torch.randn(6, spec.dim) * 3
        scale = torch.tensor(0.01) if spec.needs_tensor_scale else None
        slots = torch.tensor([5, -1, 17, 100000, 0, 31], dtype=torch.int64)  # -1 and out of range: skipped
        pages = _unaligned(torch.randint(0, 255, (4, 8, spec.token_bytes), dtype=torch.uint8))
        before = pages.clone()
        cache_write(values, slots, pages, kind, fmt, scale)
        keep = (slots >= 0) & (slots < 32)
        expected = spec.pack(values[keep], scale)  # scales and layout from the format itself
        if fmt == "fp8" and kind == "index":
            token_scale = expected[:, 128:].contiguous().view(torch.float32)
            expected[:, :128] = interpreter_e4m3(values[keep] / token_scale)
        elif fmt == "fp8":
            expected = interpreter_e4m3((values[keep] / scale).clamp(-448, 448))
        else:
            tile_scale = expected[:, 512:528].contiguous().view(torch.float32)
            tiles = values[keep][:, :512].reshape(-1, 4, 128) / tile_scale[:, :, None]
            expected[:, :512] = interpreter_e4m3(tiles.clamp(-448, 448)).reshape(-1, 512)
            expected = expected[:, :528]  # bf16 RoPE bytes: interpreter bf16 rounding is not trusted
        flat, old = pages.view(32, -1), before.view(32, -1)
        written = slots[keep]
        ok = torch.equal(flat[written][:, : expected.shape[1]], expected)
        untouched = torch.ones(32, dtype=torch.bool)
        untouched[written] = False
        ok = ok and torch.equal(flat[untouched], old[untouched])
        results[f"cache_write_{kind}_{fmt}"] = bool(ok)


def _dsa_cases(results):
    """The NVIDIA backend's fused DSA layer (``ops.dsa_attention``: its indexer writes score rows padded to a multiple
    of 16 floats, so the top-k never copies them to align them) at a context of 40 (rows of 40 scores in a 48-float
    stride): the same output, bit for bit, as its stages run one by one on unpadded scores, and the float64
    reference layer's within the tolerance."""
    import torch

    from dsahal import ops
    from dsahal.backends.nvidia import config
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.backends.triton_kernels.topk import topk

    args = small_layer_args(11)
    q_index, weights, index_pages, q, kv_pages, table, req, pos = args[:8]
    o, lse = nvidia_ops.dsa_attention(*args)
    scores = indexer_score(q_index, weights, index_pages, table, req, pos, "fp8", 40,
                           **config.indexer_config(4, q_index.dtype, "fp8"))
    slots = topk(scores, torch.clamp(pos + 1, max=40), 6, emit_slots=(req, table, 8), **config.topk_config(40))
    o2, lse2 = ops.sparse_mla(q, kv_pages, slots, kv_fmt="bf16", softmax_scale=0.1)
    want_o, want_lse = ops.dsa_attention(*args[:8], index_fmt="fp8", kv_fmt="bf16", topk=6, max_context=40,
                                         softmax_scale=0.1)
    results["dsa_padded_scores_same_bits"] = bool(torch.equal(o, o2) and torch.equal(lse, lse2))
    results["dsa_matches_reference"] = _rel(o, want_o) < 1e-5 and bool((lse - want_lse).abs().max() < 1e-4)


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_sparse_mla_cases, _indexer_cases, _topk_cases, _small_op_cases, _kda_cases, _cache_write_cases,
                       _dsa_cases))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla", "nvfp4"])
@pytest.mark.parametrize("split", [None, 16, "unaligned"])
def test_sparse_mla_matches_reference_skips_invalid_slots_and_empties_rows(interpreted, fmt, split):
    assert interpreted[f"sparse_mla_{fmt}_split{split}"]


@pytest.mark.parametrize("case", ["bf16_float32", "fp8_float32", "fp8_float8_e4m3fn"])
def test_indexer_score_matches_reference_with_unmapped_blocks_and_unaligned_pools(interpreted, case):
    assert interpreted[f"indexer_{case}"]


def test_indexer_segments_tokens_by_request_runs(interpreted):
    assert interpreted["indexer_run_offsets"]


def test_topk_returns_the_reference_set_under_the_tie_rule(interpreted):
    assert interpreted["topk_exact_tie_rule"]


def test_topk_with_rows_split_over_programs_matches_the_one_program_kernel(interpreted):
    assert interpreted["topk_split_rows_exact"]


def test_topk_can_emit_physical_slots(interpreted):
    assert interpreted["topk_emits_slots"]


def test_topk_merge_on_one_rank_is_the_single_device_top_k(interpreted):
    assert interpreted["topk_merge_single_rank"]


def test_positions_to_slots_matches_reference(interpreted):
    assert interpreted["positions_to_slots"]


def test_lse_combine_matches_reference_and_zeroes_all_minus_inf_rows(interpreted):
    assert interpreted["lse_combine"]


def test_lse_combine_never_reads_a_dead_parts_output_into_the_sum(interpreted):
    assert interpreted["lse_combine_dead_parts_unread"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kda_decode_matches_reference_and_skips_padding_requests(interpreted, dtype):
    assert interpreted[f"kda_decode_{dtype}"]


def test_kda_recurrent_prefill_matches_reference_with_empty_sequences(interpreted):
    assert interpreted["kda_prefill_recurrent"]


@pytest.mark.parametrize("case", ["index_fp8", "latent_fp8", "latent_fp8_ds_mla"])
def test_cache_write_packs_like_the_format_into_an_unaligned_pool_and_writes_only_valid_slots(interpreted, case):
    assert interpreted[f"cache_write_{case}"]


def test_the_fused_dsa_layer_pads_its_score_rows_and_gives_the_stages_bits(interpreted):
    assert interpreted["dsa_padded_scores_same_bits"]
    assert interpreted["dsa_matches_reference"]


def test_indexer_exact_fp32_path_launches_small_tiles(monkeypatch):
    """fp32 queries compile to FMA loops unrolled over the tile; the tensor-core tile (8 tokens x 4 tiles)
    kept ptxas busy for minutes on the H200. The launcher must shrink the tile for that path only."""
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((grid, meta))

    monkeypatch.setattr(indexer, "indexer_score_kernel", Recorder())
    monkeypatch.setattr(indexer, "run_offsets", torch.zeros_like)  # its kernel needs a GPU or the interpreter
    table = torch.zeros(1, 2, dtype=torch.int32)
    pages = torch.zeros(2, 16, 132, dtype=torch.uint8)
    ids = torch.zeros(3, dtype=torch.int32)
    w = torch.ones(3, 4)
    for q_dtype in (torch.float32, torch.bfloat16):
        indexer.indexer_score(torch.ones(3, 4, 128, dtype=q_dtype), w, pages, table, ids, ids, "fp8", 32)
    (_, exact), (_, fast) = launched
    assert exact["DOT"] == indexer.DOT_FP32 and (exact["GROUP"], exact["TILES"]) == (1, 1) and exact["BLOCK_N"] <= 32
    assert fast["DOT"] == indexer.DOT_BF16 and (fast["GROUP"], fast["TILES"]) == (8, 4)


@pytest.mark.parametrize("heads", [1, 4, 32, 64, 128])
def test_indexer_segment_operand_fits_one_hopper_mma(heads):
    """Tokens x heads of a segment stay within 256 rows (the widest wgmma): 8 tokens x 64 heads gave
    wrong scores on the H200. Fewer heads keep the full 8-token segment; every launch has N >= 16."""
    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels import indexer

    block_h, block_n, group, tiles = indexer.tile_shape(heads, indexer.DOT_BF16, 64, 8, 4)
    assert block_h >= heads and group * block_h <= indexer.MAX_SEGMENT_ROWS and group * block_h >= 16
    assert (block_n, tiles) == (64, 4)
    assert group == (8 if heads <= 32 else indexer.MAX_SEGMENT_ROWS // block_h)

if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))

