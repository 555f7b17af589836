"""The raw-e4m3 few-heads sparse MLA kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_small_heads_raw`)
against the float64 reference, under ``TRITON_INTERPRET=1``.

Every case runs once in a subprocess that sets the interpreter before triton is imported; each test asserts
one behaviour from its result. The kernel's nope dots are fp16 (the interpreter computes them right); its
RoPE dot is exact fp32 for non-bf16 queries. Queries are drawn as fp16 values (so the kernel's per-head
power-of-two fp16 scaling is exact and the logits must match closely) with per-head magnitudes from 2^-6 to
2^6 and one head past the fp16 range (the scaling must bring it back), plus one fp32-query case that is
rounded to fp16. Records have per-row magnitudes over 2^-6..2^6, so a later step's tile scales exceed an
earlier one's (the running-maximum rescale of the value accumulators). Covered: 1, 12, 16 and 32 heads,
-1 slots, slots past the pool, a row with no valid slot, several splits with a partial last one, 16-byte
aligned and odd-address records, a block size that is not a power of two, the reuse and re-read paths,
gather-first and tile-by-tile loads, the launcher through ``sparse_mla_small_heads(raw_fp8=True)``.
"""
from __future__ import annotations

import json

import pytest
import torch

from interpreter_child import child_results

BLOCKS, BLOCK_TOKENS = 5, 16
SLOTS = BLOCKS * BLOCK_TOKENS
TOKENS, WIDTH = 3, 37  # 37 slots: 16-slot splits end at 16, 32 and a partial 5
SCALE = 0.08
# (heads, block_n, split_size, reuse, gather_first, layout)
CASES = ((16, 16, 16, False, True, "aligned"), (16, 32, None, True, False, "odd"), (12, 16, 16, True, True, "odd"),
         (12, 16, None, False, False, "blocks10"), (1, 16, 16, False, True, "aligned"),
         (32, 16, 32, False, True, "blocks10"))


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pages(records, layout):
    """``records [SLOTS, 656]`` as pages: 16-byte aligned blocks of 16 tokens inside a larger buffer
    (``aligned``), blocks of 16 at odd addresses (``odd``: a 3-byte pad, so records are byte aligned only)
    or blocks of 10 tokens (``blocks10``). Pads are 0xFF, a NaN in e4m3: reading one shows in the output."""
    block_tokens = 10 if layout == "blocks10" else BLOCK_TOKENS
    blocks = SLOTS // block_tokens
    pad = 3 if layout == "odd" else 48
    buffer = torch.full((blocks, block_tokens * 656 + pad), 0xFF, dtype=torch.uint8)
    pages = buffer[:, : block_tokens * 656].unflatten(1, (block_tokens, 656))
    pages.copy_(records.view(blocks, block_tokens, 656))
    return pages


def _slots():
    """Random slots with -1s; row 1 has slots past the pool; the last row is all -1."""
    slots = torch.randint(-1, SLOTS, (TOKENS, WIDTH), dtype=torch.int32)
    slots[1, 5] = SLOTS + 1000
    slots[1, 9] = 2**31 - 1
    slots[-1] = -1
    return slots


def _queries(heads):
    """fp16-representable queries, head h scaled by 2^(h % 13 - 6); head 0 of a 16-head case goes past
    fp16's 65504 (so unscaled fp16 would overflow)."""
    q = torch.randn(TOKENS, heads, 576).half().float()
    q = q * torch.exp2(torch.arange(heads) % 13 - 6.0)[None, :, None]
    if heads == 16:
        q[:, 0] *= 2.0**16
    return q


def _lse_err(lse, want):
    finite = torch.isfinite(want)
    return float(((lse[finite] - want[finite]).abs() / want[finite].abs().clamp_min(1.0)).max())


def _run_all() -> dict:
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads
    from dsahal.backends.triton_kernels.sparse_mla_small_heads_raw import sparse_mla_small_heads_raw
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    torch.manual_seed(0)
    spec = latent_format("fp8_ds_mla")
    rows = torch.randn(SLOTS, 576) * torch.exp2(torch.randint(-6, 7, (SLOTS, 1)).float()) + 1e-3
    records = spec.pack(rows)
    slots = _slots()
    safe = torch.where(slots >= SLOTS, -1, slots)  # the reference reads every slot it is given
    results = {}
    for heads, block_n, split, reuse, gather_first, layout in CASES:
        q = _queries(heads)
        pages = _pages(records, layout)
        want_o, want_lse = reference(q, pages, safe, "fp8_ds_mla", None, SCALE)
        o, lse = sparse_mla_small_heads_raw(q, pages, slots, "fp8_ds_mla", None, SCALE, block_n=block_n,
                                            split_size=split, reuse=reuse, gather_first=gather_first)
        results[f"h{heads}_n{block_n}_split{split}_reuse{reuse}_gather{gather_first}_{layout}"] = dict(
            o_err=_rel(o[:-1], want_o[:-1]), lse_err=_lse_err(lse, want_lse),
            live_rows_finite=bool(torch.isfinite(want_lse[:-1]).all()),
            empty_row=bool(torch.isneginf(lse[-1]).all()) and bool((o[-1] == 0).all()),
            shape=list(o.shape), lse_shape=list(lse.shape), dtype=str(o.dtype))
    pages = _pages(records, "aligned")
    q32 = torch.randn(TOKENS, 16, 576)  # not fp16 values: rounded to 11 significant bits in the kernel
    want_o, want_lse = reference(q32, pages, safe, "fp8_ds_mla", None, SCALE)
    o, lse = sparse_mla_small_heads(q32, pages, slots, "fp8_ds_mla", None, SCALE, block_n=16, split_size=16,
                                    raw_fp8=True)
    results["fp32_q_via_launcher"] = dict(o_err=_rel(o[:-1], want_o[:-1]), lse_err=_lse_err(lse, want_lse),
                                          dtype=str(o.dtype))
    q16 = _queries(12).half()
    want_o, want_lse = reference(q16, pages, safe, "fp8_ds_mla", None, SCALE)
    o, lse = sparse_mla_small_heads_raw(q16, pages, slots, "fp8_ds_mla", None, SCALE, block_n=16, split_size=None)
    results["fp16_q"] = dict(o_err=_rel(o[:-1], want_o[:-1]), lse_err=_lse_err(lse, want_lse), dtype=str(o.dtype))
    return results


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("heads,block_n,split,reuse,gather_first,layout", CASES)
def test_raw_small_heads_match_the_float64_reference(interpreted, heads, block_n, split, reuse, gather_first,
                                                     layout):
    case = interpreted[f"h{heads}_n{block_n}_split{split}_reuse{reuse}_gather{gather_first}_{layout}"]
    assert case["live_rows_finite"], case  # the reference saw valid slots in every row but the last
    # fp16 P (11 significant bits) bounds o; the logits are exact products summed in fp32
    assert case["o_err"] < 5e-4 and case["lse_err"] < 1e-5, case
    assert case["empty_row"], case  # an all -1 row: o = 0, lse = -inf
    assert case["shape"] == [TOKENS, heads, 512] and case["lse_shape"] == [TOKENS, heads], case
    assert case["dtype"] == "torch.float32", case


def test_fp32_queries_are_rounded_to_fp16_within_the_op_tolerance(interpreted):
    case = interpreted["fp32_q_via_launcher"]
    assert case["o_err"] < 1e-3 and case["lse_err"] < 2e-3 and case["dtype"] == "torch.float32", case


def test_fp16_queries_give_fp16_output(interpreted):
    case = interpreted["fp16_q"]
    assert case["o_err"] < 1e-3 and case["lse_err"] < 1e-5 and case["dtype"] == "torch.float16", case


def test_the_raw_launcher_names_a_bad_argument():
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads
    from dsahal.backends.triton_kernels.sparse_mla_small_heads_raw import sparse_mla_small_heads_raw

    q, pages, slots = torch.zeros(1, 16, 576), torch.zeros(1, 16, 656, dtype=torch.uint8), torch.zeros(1, 4)
    with pytest.raises(ValueError, match="kv_fmt expected 'fp8_ds_mla'.*got 'nvfp4'"):
        sparse_mla_small_heads(q, torch.zeros(1, 16, 352, dtype=torch.uint8), slots, "nvfp4", None, 0.1, raw_fp8=True)
    with pytest.raises(ValueError, match=r"kv_pages expected uint8 \[num_blocks, block_tokens, 656\], got "
                                         r"torch.uint8 \[1, 16, 576\]"):
        sparse_mla_small_heads_raw(q, torch.zeros(1, 16, 576, dtype=torch.uint8), slots, "fp8_ds_mla", None, 0.1)
    with pytest.raises(ValueError, match="at most 64 heads, got 65"):
        sparse_mla_small_heads_raw(torch.zeros(1, 65, 576), pages, slots, "fp8_ds_mla", None, 0.1)
    with pytest.raises(ValueError, match="block_n expected a power of two >= 16, got 24"):
        sparse_mla_small_heads_raw(q, pages, slots, "fp8_ds_mla", None, 0.1, block_n=24)
    with pytest.raises(ValueError, match="split_size expected None or >= 1, got 0"):
        sparse_mla_small_heads_raw(q, pages, slots, "fp8_ds_mla", None, 0.1, split_size=0)


if __name__ == "__main__":
    print(json.dumps(_run_all()))
