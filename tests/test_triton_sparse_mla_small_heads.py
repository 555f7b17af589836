"""The few-heads Triton sparse MLA kernel and the shared latent decoders, under ``TRITON_INTERPRET=1``.

Like ``test_triton_kernels.py``: every case runs once in a subprocess that sets the interpreter
before triton is imported, and each test asserts one behaviour from its result. Queries are
fp32/fp16 (the interpreter's bf16 arithmetic is wrong); the bf16 MMA path is checked on the H200
by ``scripts/h200/sparse_mla_bench.py``.
"""
from __future__ import annotations

import json

import pytest
import torch

from dsahal.backends.triton_kernels import limits

from interpreter_child import child_results, run_groups

FORMATS = ("bf16", "fp8", "fp8_ds_mla", "nvfp4")
BLOCKS, BLOCK_TOKENS = 6, 16
SLOTS = BLOCKS * BLOCK_TOKENS


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _strided_pages(records, pad):
    """``records [SLOTS, token_bytes]`` as pages ``[BLOCKS, BLOCK_TOKENS, token_bytes]`` inside a larger
    buffer, the way the packed cache holds them: each block is followed by ``pad`` foreign bytes
    (set to 0xFF, a NaN in every fp8 format, so reading them shows up in the output)."""
    token_bytes = records.shape[1]
    buffer = torch.full((BLOCKS, BLOCK_TOKENS * token_bytes + pad), 0xFF, dtype=torch.uint8)
    pages = buffer[:, : BLOCK_TOKENS * token_bytes].unflatten(1, (BLOCK_TOKENS, token_bytes))
    pages.copy_(records.view(BLOCKS, BLOCK_TOKENS, token_bytes))
    assert pages.stride(0) > BLOCK_TOKENS * token_bytes
    return pages


def _slots(tokens, width):
    """Random slots over every block with -1s, one all -1 row (the last), one duplicated slot
    (row 0), one slot past the pool (row 1: skipped, never read)."""
    slots = torch.randint(-1, SLOTS, (tokens, width), dtype=torch.int32)
    slots[-1] = -1
    slots[0, 3] = slots[0, 20] = 37
    slots[1, 5] = SLOTS + 1000
    return slots


def _kernel_cases(results):
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    for fmt in FORMATS:
        spec = latent_format(fmt)
        scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
        records = spec.pack(torch.randn(SLOTS, 576) * 2, scale)
        for heads in (12, 16):
            q = torch.randn(4, heads, 576)
            slots = _slots(4, 37)  # 37 slots: splits of 16 end at 16, 32 and a partial 5
            safe = torch.where(slots >= SLOTS, -1, slots)
            for layout, pad in (("strided", 48), ("unaligned", 3)):  # pad 3: every other block at an odd address
                pages = _strided_pages(records, pad)
                want_o, want_lse = reference(q, pages, safe, fmt, scale, 0.08)
                finite = torch.isfinite(want_lse)
                for split, prefetch in ((16, False), (16, True), (None, True)):
                    o, lse = sparse_mla_small_heads(q, pages, slots, fmt, scale, 0.08, block_n=16, split_size=split,
                                                    prefetch=prefetch, num_stages=1)
                    results[f"{fmt}_h{heads}_{layout}_split{split}_prefetch{prefetch}"] = dict(
                        o_err=_rel(o, want_o), lse_err=float((lse[finite] - want_lse[finite]).abs().max()),
                        empty_row=bool(torch.isneginf(lse[-1]).all()) and bool((o[-1] == 0).all()),
                        shape=list(o.shape), dtype=str(o.dtype))
        q16 = torch.randn(2, 16, 576).half()
        slots = _slots(2, 24)
        safe = torch.where(slots >= SLOTS, -1, slots)
        pages = records.view(BLOCKS, BLOCK_TOKENS, -1)
        o, lse = sparse_mla_small_heads(q16, pages, slots, fmt, scale, 0.08, block_n=16, split_size=16)
        want_o, want_lse = reference(q16, pages, safe, fmt, scale, 0.08)
        results[f"{fmt}_fp16"] = dict(o_err=_rel(o, want_o), lse_err=float((lse[0] - want_lse[0]).abs().max()),
                                      dtype=str(o.dtype))


def _decode_cases(results):
    """The shared decoders against the formats' own decode, on records holding every code."""
    global tl, _mla  # a jit kernel resolves names in its module's globals
    import triton
    import triton.language as tl

    from dsahal.backends.triton_kernels import sparse_mla as _mla
    from dsahal.backends.triton_kernels.bytes import LATENT_CODES, typed_views
    from dsahal.formats import latent_format

    @triton.jit
    def decode_kernel(pages_u8, pages_u16, pages_f32, s8_b, s8_t, s16_b, s16_t, s32_b, s32_t, out_ptr,
                      FMT: tl.constexpr, N: tl.constexpr):
        slot = tl.arange(0, N).to(tl.int64)
        valid = slot >= 0
        rows = _mla.record_rows(slot, 1, (s8_b, s8_t, s16_b, s16_t, s32_b, s32_t))
        codes, scales = _mla.load_nope_raw(pages_u8, pages_u16, pages_f32, rows, valid, 0, 512, FMT, True)
        nope = _mla.decode_nope(codes, scales, FMT, False)
        rope = _mla.decode_rope(_mla.load_rope_raw(pages_u8, pages_u16, rows, valid, FMT, True), FMT, False)
        tl.store(out_ptr + slot[:, None] * 576 + tl.arange(0, 512)[None, :], nope)
        tl.store(out_ptr + slot[:, None] * 576 + 512 + tl.arange(0, 64)[None, :], rope)

    n = 8
    finite_e4m3 = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)  # 254 codes
    every = torch.cat([finite_e4m3] * 3)  # every finite e4m3 byte (signs, subnormals included) thrice
    records = torch.cat([
        torch.stack([torch.randperm(256) for _ in range(n)]).to(torch.uint8),  # every e2m1 pair in every row
        every[torch.randperm(762)[: n * 64]].view(n, 64),  # RoPE bytes
        every[:n * 32].view(n, 32),  # block scales: each of the 254 at least once
    ], dim=1)
    ds = latent_format("fp8_ds_mla").pack(torch.randn(n, 576) * 3)
    ds[:, 512:528] = torch.rand(n, 4).mul(0.7).add(1e-3).view(torch.uint8)  # scales not powers of two
    ds[:, :512] = finite_e4m3[torch.randint(0, 254, (n, 512))]
    for fmt, recs in (("nvfp4", records), ("fp8_ds_mla", ds)):
        pages = recs.view(n, 1, -1)
        views = typed_views(pages)
        out = torch.empty(n, 576)
        decode_kernel[(1,)](views[0][0], views[1][0], views[2][0], *(s for _, sb, st in views for s in (sb, st)),
                            out, FMT=LATENT_CODES[fmt], N=n)
        want = latent_format(fmt).unpack(recs)
        results[f"decode_{fmt}"] = dict(equal=bool(torch.equal(out, want)),
                                        mismatches=int((out != want).sum()))


def _run_all() -> dict:
    torch.manual_seed(0)
    return run_groups((_kernel_cases, _decode_cases), normalise=False)


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [12, 16])
@pytest.mark.parametrize("layout", ["strided", "unaligned"])
@pytest.mark.parametrize("split,prefetch", [(16, False), (16, True), (None, True)])
def test_small_heads_match_the_reference_with_skipped_duplicated_and_empty_slots(interpreted, fmt, heads, layout,
                                                                                 split, prefetch):
    case = interpreted[f"{fmt}_h{heads}_{layout}_split{split}_prefetch{prefetch}"]
    assert case["o_err"] < 1e-5 and case["lse_err"] < 1e-4, case
    assert case["empty_row"], case  # an all -1 row: o = 0, lse = -inf
    assert case["shape"] == [4, heads, 512] and case["dtype"] == "torch.float32", case


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_heads_fp16_queries_give_fp16_output(interpreted, fmt):
    case = interpreted[f"{fmt}_fp16"]
    assert case["dtype"] == "torch.float16" and case["o_err"] < 2e-3 and case["lse_err"] < 1e-3, case


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_ds_mla"])
def test_in_kernel_decode_equals_the_format_decode_on_every_code(interpreted, fmt):
    assert interpreted[f"decode_{fmt}"]["equal"], interpreted[f"decode_{fmt}"]


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _mla_args(heads=16, fmt="fp8_ds_mla", q_dtype=torch.bfloat16):
    return (_meta(4, heads, 576, dtype=q_dtype), _meta(8, 64, 656, dtype=torch.uint8),
            _meta(4, 2048, dtype=torch.int32), fmt, None, 0.07)


def _anywhere(**tensors):
    return True, ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_limits_accept_every_latent_format_for_both_kernels(fmt):
    assert limits.sparse_mla_small_heads(*_mla_args(fmt=fmt), device_check=_anywhere) == (True, "")
    assert limits.sparse_mla(*_mla_args(fmt=fmt), device_check=_anywhere) == (True, "")


def test_limits_name_what_the_small_head_kernel_cannot_take():
    ok, why = limits.sparse_mla_small_heads(*_mla_args(heads=65), device_check=_anywhere)
    assert not ok and "at most 64 heads" in why and "[4, 65, 576]" in why
    ok, why = limits.sparse_mla_small_heads(*_mla_args(fmt="mxfp4"), device_check=_anywhere)
    assert not ok and "'mxfp4'" in why
    ok, why = limits.sparse_mla_small_heads(*_mla_args(q_dtype=torch.float8_e4m3fn), device_check=_anywhere)
    assert not ok and "float8_e4m3fn" in why
    ok, why = limits.sparse_mla_small_heads(torch.zeros(2, 16, 576), *_mla_args()[1:])
    assert not ok and "'q' is on cpu" in why


if __name__ == "__main__":
    print(json.dumps(_run_all()))
