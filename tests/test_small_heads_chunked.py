"""The chunked few-heads sparse MLA kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_small_heads`)
against the float64 reference, under ``TRITON_INTERPRET=1``.

Every case runs once in a subprocess that sets the interpreter before triton is imported; each test
asserts one behaviour from its result. Queries are fp32 (exact dots; the interpreter's bf16 arithmetic
is wrong): the bf16 MMA path is checked on the H200 by ``scripts/h200/small_heads_sweep.py``.
Covered: each latent format, 12 and 16 heads, -1 slots, slots past the pool, a duplicated slot, a row
with no valid slot, page views inside a larger (and oddly aligned) pool, the re-read and reuse paths,
the gather-first and chunk-by-chunk loads, one split and several (partial last split).
"""
from __future__ import annotations

import json

import pytest
import torch

from interpreter_child import child_results

FORMATS = ("bf16", "fp8", "fp8_ds_mla", "nvfp4")
BLOCKS, BLOCK_TOKENS = 5, 16
SLOTS = BLOCKS * BLOCK_TOKENS
TOKENS, WIDTH = 3, 37  # 37 slots: 16-slot splits end at 16, 32 and a partial 5
# (reuse, gather_first, split_size, layout): each format x heads pair runs all four
VARIANTS = ((False, True, 16, "strided"), (True, False, 16, "strided"), (False, False, None, "unaligned"),
            (True, True, None, "unaligned"))


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pool_pages(records, pad):
    """``records [SLOTS, token_bytes]`` as pages ``[BLOCKS, BLOCK_TOKENS, token_bytes]`` inside a larger
    buffer: each block is followed by ``pad`` foreign bytes set to 0xFF (NaN in every fp8 format, so a
    read of them shows in the output). ``pad`` 3 puts every other block at an odd address."""
    token_bytes = records.shape[1]
    buffer = torch.full((BLOCKS, BLOCK_TOKENS * token_bytes + pad), 0xFF, dtype=torch.uint8)
    pages = buffer[:, : BLOCK_TOKENS * token_bytes].unflatten(1, (BLOCK_TOKENS, token_bytes))
    pages.copy_(records.view(BLOCKS, BLOCK_TOKENS, token_bytes))
    return pages


def _slots():
    """Random slots with -1s; row 0 repeats slot 37; row 1 has a slot past the pool; the last row is all -1."""
    slots = torch.randint(-1, SLOTS, (TOKENS, WIDTH), dtype=torch.int32)
    slots[0, 3] = slots[0, 20] = 37
    slots[1, 5] = SLOTS + 1000
    slots[1, 9] = 2**31 - 1
    slots[-1] = -1
    return slots


def _run_all() -> dict:
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    torch.manual_seed(0)
    results = {}
    for fmt in FORMATS:
        spec = latent_format(fmt)
        scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
        records = spec.pack(torch.randn(SLOTS, 576) * 2 + 1e-3, scale)
        for heads in (12, 16):
            q = torch.randn(TOKENS, heads, 576)
            slots = _slots()
            safe = torch.where(slots >= SLOTS, -1, slots)  # the reference reads every slot it is given
            for reuse, gather_first, split, layout in VARIANTS:
                pages = _pool_pages(records, 48 if layout == "strided" else 3)
                want_o, want_lse = reference(q, pages, safe, fmt, scale, 0.08)
                o, lse = sparse_mla_small_heads(q, pages, slots, fmt, scale, 0.08, block_n=16, split_size=split,
                                                reuse=reuse, gather_first=gather_first)
                finite = torch.isfinite(want_lse)
                results[f"{fmt}_h{heads}_reuse{reuse}_gather{gather_first}_split{split}_{layout}"] = dict(
                    o_err=_rel(o[:-1], want_o[:-1]), lse_err=float((lse[finite] - want_lse[finite]).abs().max()),
                    live_rows_finite=bool(finite[:-1].all()),
                    empty_row=bool(torch.isneginf(lse[-1]).all()) and bool((o[-1] == 0).all()),
                    shape=list(o.shape), lse_shape=list(lse.shape), dtype=str(o.dtype))
    return results


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [12, 16])
@pytest.mark.parametrize("reuse,gather_first,split,layout", VARIANTS)
def test_chunked_small_heads_match_the_float64_reference(interpreted, fmt, heads, reuse, gather_first, split, layout):
    case = interpreted[f"{fmt}_h{heads}_reuse{reuse}_gather{gather_first}_split{split}_{layout}"]
    assert case["live_rows_finite"], case  # the reference saw valid slots in every row but the last
    assert case["o_err"] < 1e-5 and case["lse_err"] < 1e-4, case
    assert case["shape"] == [TOKENS, heads, 512] and case["lse_shape"] == [TOKENS, heads], case
    assert case["dtype"] == "torch.float32", case


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_with_no_valid_slot_gives_zero_output_and_minus_inf_lse(interpreted, fmt):
    for key, case in interpreted.items():
        if key.startswith(fmt + "_"):
            assert case["empty_row"], (key, case)


def test_the_launcher_names_a_bad_argument():
    from dsahal.backends.triton_kernels.sparse_mla_small_heads import sparse_mla_small_heads

    q, pages, slots = torch.zeros(1, 65, 576), torch.zeros(1, 16, 656, dtype=torch.uint8), torch.zeros(1, 4)
    with pytest.raises(ValueError, match="at most 64 heads, got 65"):
        sparse_mla_small_heads(q, pages, slots, "fp8_ds_mla", None, 0.1)
    with pytest.raises(ValueError, match="block_n expected a power of two >= 16, got 24"):
        sparse_mla_small_heads(q[:, :16], pages, slots, "fp8_ds_mla", None, 0.1, block_n=24)
    with pytest.raises(ValueError, match="split_size expected None or >= 1, got 0"):
        sparse_mla_small_heads(q[:, :16], pages, slots, "fp8_ds_mla", None, 0.1, split_size=0)


if __name__ == "__main__":
    print(json.dumps(_run_all()))
