"""The stacked block-tile indexer (``backends/triton_kernels/indexer_stack.py``: a segment's tokens in one MMA per
key tile) against the float64 reference and the per-token block-tile kernel, under ``TRITON_INTERPRET=1``.

All launches run once in a subprocess that sets ``TRITON_INTERPRET=1`` before triton is imported; each test
asserts one behaviour from its result. The interpreter's bf16 dots are wrong, so the kernels run with exact
fp32 dots (``dot=DOT_FP32``; the head-sum MMAs of stack modes 2 and 3 then multiply their bf16 hi and lo
parts widened to fp32: the same values) or FP8 queries (FP8 MMA, exact here) with stack mode 1 (modes 2
and 3 multiply bf16 operands: checked on the H200 by ``scripts/h200/indexer_sweep.py --stack``).
"""
from __future__ import annotations

import json

import pytest

from interpreter_child import child_results, run_groups

TOL_EXACT = 1e-6  # relative (norm) error vs the float64 reference: fp32 dots, exact keys
# head sums through bf16 hi + lo (about 16 significant bits per term); a bf16 operand without its lo part
# is ~2^-9 off, so this bound still tells a missing or wrong lo apart
TOL_SPLIT = 1e-4
HEADS = 5  # padded to 16 rows per token: exercises the head mask


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _case():
    """Requests with runs of 1, 2, 3, 5 and 8 tokens (request 1's run then continues after request 2: a second
    run, its offsets restarting), positions ending mid-tile, request 0 shorter than one tile, unmapped (-1)
    and out-of-range (999) blocks, 16-token blocks; 7 blocks of table per request (112 keys)."""
    import torch

    table = torch.tensor([[3, 1, 0, 7, -1, 5, 9],
                          [2, 4, 6, 8, 999, 10, 11],
                          [11, -1, 0, 5, 6, 1, 2],
                          [5, 9, 1, -1, 3, 7, 0],
                          [8, 2, 10, 4, -1, 6, 11]], dtype=torch.int32)
    runs = [(0, [9]), (1, [20, 37]), (2, [5, 99, 52]), (1, [60]), (3, [40, 41, 42, 43, 95]),
            (4, [70, 71, 72, 73, 74, 75, 76, 111])]
    req = torch.tensor([r for r, ps in runs for _ in ps], dtype=torch.int32)
    pos = torch.tensor([p for _, ps in runs for p in ps], dtype=torch.int32)
    return table, req, pos


def _compare(got, want, tol):
    import torch

    finite = torch.isfinite(want)
    same_mask = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
    return same_mask and _rel(got[finite], want[finite]) < tol


def _stack_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    table, req, pos = _case()
    tokens, width = req.shape[0], 112  # not a multiple of the tile: the last tile is partly past the output
    offsets = run_offsets(req)
    dense = (torch.randn(12 * 16, 128) + 1e-3) * (torch.rand(12 * 16, 1) * 3 + 0.1)
    pages = index_format("fp8").pack(dense).view(12, 16, -1)
    safe = torch.where(table >= 12, -1, table)
    q = torch.randn(tokens, HEADS, 128)
    w = torch.randn(tokens, HEADS)
    want = reference(q, w, pages, safe, req, pos, "fp8", width)
    results["case_has_both"] = bool(torch.isfinite(want).any()) and bool(torch.isinf(want).any())

    def run(q_in, dot, **options):
        out = torch.full((tokens, width), float("nan"))  # an element the kernel does not write stays NaN
        return d.launch(q_in, w, pages, table, req, pos, offsets, "fp8", width, out, dot=dot, block_n=16, **options)

    current = {group: run(q, d.DOT_FP32, group=group, tiles=3, loop=1) for group in (3, 5, 8)}
    results["current_matches_reference"] = all(_compare(got, want, TOL_EXACT) for got in current.values())
    # every stack mode, padded and split, segments of up to 3, 5 and 8 tokens, the four tile loops in turn
    loops = iter([0, 1, 2, 3] * 5)
    for stack in (1, 2, 3):
        tol = TOL_EXACT if stack == 1 else TOL_SPLIT
        for split in (False, True):
            ok_ref = ok_cur = True
            for group in (3, 5, 8):
                got = run(q, d.DOT_FP32, group=group, tiles=2 + group % 2, loop=next(loops), stack=stack,
                          stack_split=split)
                ok_ref &= _compare(got, want, tol)
                ok_cur &= _compare(got, current[group], tol)
            results[f"stack{stack}_{'split' if split else 'pad'}_reference"] = ok_ref
            results[f"stack{stack}_{'split' if split else 'pad'}_current"] = ok_cur

    # FP8 queries (FP8 MMA), uint8 and e4m3-typed key views, head sums in registers
    q8 = q.to(torch.float8_e4m3fn)
    want8 = reference(q8.float(), w, pages, safe, req, pos, "fp8", width)
    ok8 = True
    for split, typed, loop in ((False, False, 1), (True, True, 3), (True, False, 2)):
        got = run(q8, d.DOT_FP8, group=5, tiles=4, loop=loop, stack=1, stack_split=split, typed_keys=typed)
        ok8 &= _compare(got, want8, TOL_EXACT)
    results["fp8q_stack1"] = ok8


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_stack_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_reference_case_has_visible_and_masked_scores(interpreted):
    assert interpreted["case_has_both"]


def test_per_token_kernel_matches_reference_on_the_case(interpreted):
    assert interpreted["current_matches_reference"]


@pytest.mark.parametrize("stack", [1, 2, 3])
@pytest.mark.parametrize("pieces", ["pad", "split"])
def test_stacked_scores_match_the_reference(interpreted, stack, pieces):
    assert interpreted[f"stack{stack}_{pieces}_reference"]


@pytest.mark.parametrize("stack", [1, 2, 3])
@pytest.mark.parametrize("pieces", ["pad", "split"])
def test_stacked_scores_match_the_per_token_kernel(interpreted, stack, pieces):
    assert interpreted[f"stack{stack}_{pieces}_current"]


def test_stacked_scores_with_fp8_queries(interpreted):
    assert interpreted["fp8q_stack1"]


def test_pieces_and_refusals():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer_stack import largest_piece

    assert [largest_piece(g, False) for g in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [largest_piece(g, True) for g in range(1, 9)] == [1, 2, 2, 4, 4, 4, 4, 8]

    def launch(heads=32, fmt="fp8", width=132, **options):
        q = torch.zeros(2, heads, 128, dtype=torch.bfloat16)
        ids = torch.zeros(2, dtype=torch.int32)
        return d.launch(q, torch.zeros(2, heads), torch.zeros(4, 64, width, dtype=torch.uint8),
                        torch.zeros(1, 4, dtype=torch.int32), ids, ids, ids, fmt, 64, torch.empty(2, 64),
                        dot=d.DOT_BF16, **options)

    with pytest.raises(ValueError, match=r"indexer_score: stack must be one of \[0, 1, 2, 3\] .* got 4"):
        launch(stack=4)
    with pytest.raises(ValueError, match=r"indexer_score: stack 1 .* takes FP8 keys, got index_fmt='mxfp4'"):
        launch(fmt="mxfp4", width=68, stack=1)
    with pytest.raises(ValueError, match=r"indexer_score: stack 2 stacks up to 256 .* got 512 \(group=5, "
                                         r"stack_split=False, 64 heads padded\)"):
        launch(heads=64, group=5, stack=2)
    with pytest.raises(ValueError, match=r"indexer_score: stack_split .* got stack_split=True with stack=0"):
        launch(stack_split=True)


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
