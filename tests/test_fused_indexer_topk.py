"""The fused indexer -> top-k (issue 18 item 4): the block-tile indexer writes the top-k's group maxima from
its registers (``indexer_decode.launch(group_maxima=...)``), and the groups top-k skips the pass that would
read every score to find them (``topk(..., group_maxima=...)``). Under ``TRITON_INTERPRET=1`` on the CPU.

The maxima are checked against their definition computed here from the scores the same launch stored (the
max of each group's entries below the row's causal length, as an order-preserving key; 0 where none is
visible), on unmapped blocks, positions mid-tile and mid-group, a width that is not a multiple of the group,
and every tile loop form; then the nvidia backend's ``dsa_attention`` with the fused path forced on short rows
against the float64 reference and against the same call unfused.
"""
from __future__ import annotations

import json

import pytest

from interpreter_child import child_results, run_groups


def sort_keys(scores):
    """The top-k's order-preserving uint32 key of fp32 ``scores`` (``topk_common._sort_key``), as int64."""
    import torch

    x = torch.where(scores == 0, torch.zeros_like(scores), scores)
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    negative = bits >= 0x80000000
    return torch.where(negative, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def expected_maxima(scores, positions, max_context: int, size: int):
    """``[T, cdiv(max_context, size)]`` keys: each group's max over entries ``<= position`` and finite above
    -inf, 0 for a group with none."""
    import torch

    tokens = scores.shape[0]
    groups = -(-max_context // size)
    padded = torch.full((tokens, groups * size), float("-inf"))
    padded[:, :max_context] = scores
    cols = torch.arange(groups * size)
    padded[cols[None, :] > positions.to(torch.int64)[:, None]] = float("-inf")
    best = padded.view(tokens, groups, size).amax(dim=2)
    return torch.where(torch.isneginf(best), torch.zeros_like(best, dtype=torch.int64), sort_keys(best))


def _maxima_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode
    from dsahal.backends.triton_kernels.indexer import indexer_score, run_offsets
    from dsahal.formats import index_format

    from indexer_cases import paged_case

    table, req, pos = paged_case(16)
    offsets = run_offsets(req)
    width = 60  # not a multiple of 8: the last group is partly past the row
    for fmt in ("fp8", "mxfp4"):
        pages = index_format(fmt).pack(torch.randn(8 * 16, 128) * 2).view(8, 16, -1)
        q = torch.randn(8, 4, 128)
        w = torch.randn(8, 4)
        for size in (4, 8, 16):
            for group, tiles, loop in ((1, 1, 0), (5, 2, 1), (3, 1, 2), (8, 2, 3)):
                maxima = torch.full((8, -(-width // size) + 3), -7, dtype=torch.int32)  # 3 spare columns
                out = indexer_decode.launch(q, w, pages, table, req, pos, offsets, fmt, width, torch.empty(8, width),
                                            dot=indexer_decode.DOT_FP32, block_n=16, group=group, tiles=tiles,
                                            loop=loop, group_maxima=(maxima, size))
                want = expected_maxima(out, pos, width, size)
                got = maxima[:, :want.shape[1]].to(torch.int64) & 0xFFFFFFFF
                key = f"maxima_{fmt}_{size}_{group}_{loop}"
                results[key] = torch.equal(got, want) and bool((maxima[:, want.shape[1]:] == -7).all())
                results[f"nonzero_{key}"] = bool((want > 0).any()) and bool((want == 0).any())
        # FP8 queries through indexer_score (the backend's path), and the general kernel's pass on the same call
        q8 = torch.randn(8, 4, 128).to(torch.float8_e4m3fn)
        for name, options in (("tiles", dict(block_tiles=True)), ("general", dict(block_tiles=False)),
                              ("odd_group", dict(block_tiles=True, group_size=32))):
            size = options.pop("group_size", 8)
            maxima = torch.zeros((8, -(-width // size)), dtype=torch.int32)
            out = indexer_score(q8, w, pages, table, req, pos, fmt, width, block_n=16,
                                group_maxima=(maxima, size), **options)
            results[f"launcher_{fmt}_{name}"] = torch.equal(maxima.to(torch.int64) & 0xFFFFFFFF,
                                                            expected_maxima(out, pos, width, size))


def _topk_cases(results):
    import torch

    from dsahal.backends.triton_kernels.topk import topk
    from dsahal.backends.triton_kernels.topk_groups import group_layout

    torch.manual_seed(1)
    rows, width, k = 5, 300, 16
    scores = torch.randn(rows, width)
    scores[1, 40:90] = float("-inf")
    lengths = torch.tensor([300, 250, 17, 0, 129], dtype=torch.int32)
    cfg = dict(method="groups", chunk=64, steps=2, batch=8, finish_chunk=64)
    layout = group_layout(width, k, chunk=64, steps=2, batch=8)
    pos = (lengths - 1).clamp_min(-1)
    padded = torch.full((rows, layout.columns * layout.size), float("-inf"))
    padded[:, :width] = scores
    want_maxima = expected_maxima(padded, pos, layout.columns * layout.size, layout.size)
    maxima = torch.where(want_maxima >= 1 << 31, want_maxima - (1 << 32), want_maxima).to(torch.int32)
    results["topk_given_maxima"] = torch.equal(topk(scores, lengths, k, group_maxima=maxima.contiguous(), **cfg),
                                               topk(scores, lengths, k, **cfg))
    # maxima that lie (a live group marked dead) change the answer: the given maxima are what the top-k reads
    lying = maxima.clone()
    lying[0] = 0
    results["topk_reads_given_maxima"] = not torch.equal(topk(scores, lengths, k, group_maxima=lying, **cfg),
                                                         topk(scores, lengths, k, **cfg))
    try:
        topk(scores, lengths, k, group_maxima=maxima[:, :-1], **cfg)
        results["topk_rejects_bad_maxima"] = False
    except ValueError as exc:
        results["topk_rejects_bad_maxima"] = "group_maxima" in str(exc) or "maxima" in str(exc)


def _dsa_cases(results):
    import torch

    from dsahal import ops
    from dsahal.backends.nvidia import config
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.formats import index_format, latent_format
    from dsahal.reference.dsa_attention import dsa_attention as reference

    from indexer_cases import paged_case

    torch.manual_seed(2)
    table, req, pos = paged_case(16)
    width, k = 64, 8
    index_pages = index_format("fp8").pack(torch.randn(8 * 16, 128)).view(8, 16, -1)
    kv_pages = latent_format("bf16").pack(torch.randn(8 * 16, 576)).view(8, 16, -1)
    q_index = torch.randn(8, 4, 128).to(torch.float8_e4m3fn)
    w = torch.randn(8, 4)
    q = torch.randn(8, 4, 576)
    args = (q_index, w, index_pages, q, kv_pages, table, req, pos, "fp8", "bf16", None, k, width, 576 ** -0.5)
    safe = torch.where(table >= 8, -1, table)
    want_o, want_lse = reference(q_index.float(), w, index_pages, q, kv_pages, safe, req, pos, "fp8", "bf16", None,
                                 k, width, 576 ** -0.5)
    calls = []
    real_topk = nvidia_ops._topk.topk

    def recording_topk(*a, **kw):
        calls.append(kw.get("group_maxima") is not None)
        return real_topk(*a, **kw)

    original = config.topk_config
    nvidia_ops._topk.topk = recording_topk
    try:
        config.topk_config = lambda width: dict(method="groups", chunk=32, steps=1, batch=8, finish_chunk=64)
        fused_o, fused_lse = nvidia_ops.dsa_attention(*args)
        config.topk_config = lambda width: dict(method="bound", chunk=32, finish_chunk=64)
        plain_o, plain_lse = nvidia_ops.dsa_attention(*args)
    finally:
        config.topk_config = original
        nvidia_ops._topk.topk = real_topk
    results["dsa_fused_taken"] = calls == [True, False]
    results["dsa_fused_equals_unfused"] = torch.equal(fused_o, plain_o) and torch.equal(fused_lse, plain_lse)
    rel = float((fused_o.double() - want_o.double()).norm() / want_o.double().norm())
    results["dsa_fused_matches_reference"] = rel < 2e-2 and torch.allclose(fused_lse.double(), want_lse.double(),
                                                                           atol=2e-2, rtol=0)
    del ops


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_maxima_cases, _topk_cases, _dsa_cases))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("size", [4, 8, 16])
@pytest.mark.parametrize("group,loop", [(1, 0), (5, 1), (3, 2), (8, 3)])
def test_indexer_writes_the_group_maxima_of_its_scores(interpreted, fmt, size, group, loop):
    key = f"maxima_{fmt}_{size}_{group}_{loop}"
    assert interpreted[key]
    assert interpreted[f"nonzero_{key}"]  # the case has visible and empty groups


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("path", ["tiles", "general", "odd_group"])
def test_indexer_score_fills_the_maxima_on_every_path(interpreted, fmt, path):
    assert interpreted[f"launcher_{fmt}_{path}"]


def test_groups_topk_with_given_maxima_equals_its_own_pass(interpreted):
    assert interpreted["topk_given_maxima"]


def test_groups_topk_reads_the_given_maxima(interpreted):
    assert interpreted["topk_reads_given_maxima"]


def test_groups_topk_rejects_maxima_of_the_wrong_shape(interpreted):
    assert interpreted["topk_rejects_bad_maxima"]


def test_nvidia_dsa_attention_takes_the_fused_path_for_the_groups_method(interpreted):
    assert interpreted["dsa_fused_taken"]


def test_fused_dsa_attention_equals_the_unfused_layer(interpreted):
    assert interpreted["dsa_fused_equals_unfused"]


def test_fused_dsa_attention_matches_the_reference(interpreted):
    assert interpreted["dsa_fused_matches_reference"]


def test_topk_rejects_maxima_for_other_methods():
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels.topk import topk

    with pytest.raises(ValueError, match="group_maxima"):
        topk(torch.randn(2, 64), torch.tensor([64, 64], dtype=torch.int32), 4, method="bound",
             group_maxima=torch.zeros(2, 8, dtype=torch.int32))


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
