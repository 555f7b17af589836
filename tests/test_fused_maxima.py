"""The fused indexer -> top-k on the nvidia DSA layer (``config.FUSED_GROUP_MAXIMA``): the layer asks its indexer for
the top-k's group maxima and hands them to the groups method only where the indexer says it filled them.

Gluon (the kernel that fills them) has no interpreter: here, in a child process under ``TRITON_INTERPRET=1``, the
layer runs once with the real indexer (the ``tl`` kernel: nothing filled, the top-k makes its own maxima) and once with
an indexer stand-in that fills them in torch as the Gluon kernel's contract says; both must give the unfused layer's
output bit for bit, and the top-k must have been handed the maxima exactly when they were filled. The Gluon kernel's
own maxima are checked on the H200 (``scripts/h200/fused_maxima_check.py``, whose CPU smoke run is the last test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from dsa_layer_case import small_layer_args
from interpreter_child import child_results, run_groups

HERE = os.path.dirname(os.path.abspath(__file__))
# the groups method at the small layer's 40-key rows (the backend's starts at 64K): groups of 8
SMALL_GROUPS = dict(method="groups", chunk=16, steps=2, batch=4, group_size=8, num_warps=1, finish_chunk=16,
                    finish_warps=1, segment_histograms=True)


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


def _layer_cases(results):
    from dsahal.backends.nvidia import config, ops as nvidia_ops
    from dsahal.backends.triton_kernels import indexer, topk
    from dsahal.backends.triton_kernels.topk_groups import maxima_of

    args = small_layer_args(5)
    real_indexer, real_topk, real_config = indexer.indexer_score, topk.topk, config.topk_config
    handed = []  # whether each top-k call got group maxima

    def recording_topk(*a, group_maxima=None, **k):
        handed.append(group_maxima is not None)
        return real_topk(*a, group_maxima=group_maxima, **k)

    def filling_indexer(q, weights, pages, table, req, pos, fmt, max_context, *, group_maxima=None, maxima_group=16,
                        **k):  # the Gluon kernel's contract, in torch
        scores = real_indexer(q, weights, pages, table, req, pos, fmt, max_context, **k)
        if group_maxima is None:
            return scores
        lengths = torch.clamp(pos.to(torch.int32) + 1, max=max_context)
        filled = maxima_of(scores, lengths, maxima_group, group_maxima.shape[1])
        tail = -(-max_context // maxima_group)
        assert bool((group_maxima[:, tail:] == 0).all()), "the layer must zero the columns past the groups"
        group_maxima[:, :tail] = filled[:, :tail]
        return scores, True

    config.topk_config = lambda width: SMALL_GROUPS
    topk.topk = recording_topk
    try:
        config.FUSED_GROUP_MAXIMA = frozenset()
        config.FUSED_MAXIMA_TOKENS = 8  # (the small layer's 5 tokens of 2 requests: 3 a request)
        want = nvidia_ops.dsa_attention(*args)
        results["apart_handed"] = str(handed)
        handed.clear()
        config.FUSED_GROUP_MAXIMA = frozenset({("fp8", torch.float32)})
        got = nvidia_ops.dsa_attention(*args)  # the tl indexer: nothing filled
        results["unfilled_handed"] = str(handed)
        results["unfilled_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, want))
        handed.clear()
        indexer.indexer_score = filling_indexer
        got = nvidia_ops.dsa_attention(*args)
        results["filled_handed"] = str(handed)
        results["filled_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, want))
        handed.clear()
        config.FUSED_MAXIMA_TOKENS = 2  # the shipped limit: the small layer's 3 tokens a request are past it
        got = nvidia_ops.dsa_attention(*args)
        results["past_limit_handed"] = str(handed)
        results["past_limit_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        indexer.indexer_score, topk.topk, config.topk_config = real_indexer, real_topk, real_config


def _run_all() -> dict:
    return run_groups((_layer_cases,))


_RESULTS: dict = {}


def interpreted() -> dict:
    if not _RESULTS:
        _RESULTS.update(child_results(__file__))
    return _RESULTS


def test_the_layer_hands_the_top_k_no_maxima_when_off_or_unfilled():
    results = interpreted()
    assert results["apart_handed"] == "[False]"
    assert results["unfilled_handed"] == "[False]"
    assert results["unfilled_bitwise"]


def test_the_layer_hands_the_filled_maxima_to_the_top_k_and_gets_the_same_bits():
    results = interpreted()
    assert results["filled_handed"] == "[True]"
    assert results["filled_bitwise"]


def test_the_layer_runs_the_stages_apart_past_the_tokens_a_request_limit():
    results = interpreted()
    assert results["past_limit_handed"] == "[False]"
    assert results["past_limit_bitwise"]


def test_the_fused_maxima_are_shipped_for_fp8_keys_and_queries_at_one_or_two_tokens_a_request(monkeypatch):
    # (the thirty-sixth session's layer measurement from CUDA-graph replays: 3-7.5% faster at 64 x 1 and 64 x 2, no
    # gain at 64 x 5; config.py's comment)
    from dsahal.backends.nvidia import config

    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    fp8 = torch.float8_e4m3fn
    asked = {(fmt, q, n) for fmt in ("fp8", "mxfp4", "bf16") for q in (fp8, torch.bfloat16) for n in (1, 2, 3, 5)
             if config.fused_group_maxima(fmt, q, n)}
    assert asked == {("fp8", fp8, 1), ("fp8", fp8, 2)}


def test_the_fused_maxima_are_asked_for_listed_formats_up_to_the_tokens_a_request_limit(monkeypatch):
    from dsahal.backends.nvidia import config

    fp8 = torch.float8_e4m3fn
    monkeypatch.setattr(config, "FUSED_GROUP_MAXIMA", frozenset({("fp8", fp8)}))
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    assert [config.fused_group_maxima("fp8", fp8, n) for n in (1, 2, 3, 5)] == [True, True, False, False]
    assert not config.fused_group_maxima("fp8", torch.bfloat16, 1)
    assert not config.fused_group_maxima("mxfp4", fp8, 1)
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # (its indexer, the tl kernel, makes none)
    assert not config.fused_group_maxima("fp8", fp8, 1)


def test_the_indexer_names_bad_group_maxima():
    import pytest

    from dsahal.backends.triton_kernels import indexer

    q_index, weights, index_pages, _, _, table, req, pos = small_layer_args(2)[:8]
    call = (q_index, weights, index_pages, table, req, pos, "fp8", 40)
    good = torch.zeros(5, 3, dtype=torch.int32)  # cdiv(40, 16) = 3 columns
    for bad, size in ((torch.zeros(5, 2, dtype=torch.int32), 16), (good.long(), 16), (torch.zeros(4, 3, dtype=torch.int32), 16),
                      (torch.zeros(3, 5, dtype=torch.int32).t(), 16), ([[0] * 3] * 5, 16)):
        with pytest.raises(ValueError, match=r"group_maxima expected an int32 \[5, >= 3\] tensor with unit last stride"):
            indexer.indexer_score(*call, group_maxima=bad, maxima_group=size)
    with pytest.raises(ValueError, match=r"maxima_group expected one of \(8, 16, 32, 64\), got 12"):
        indexer.indexer_score(*call, group_maxima=good, maxima_group=12)


def test_the_gluon_launch_names_bad_maxima_with_the_same_check():
    # (its checks run before any compile: the launch is called directly here, its refusal said to be checked)
    import pytest

    from dsahal.backends.triton_kernels import indexer_gluon

    q_index, weights, index_pages, _, _, table, req, pos = small_layer_args(2)[:8]
    zeros = torch.zeros(q_index.shape[0], dtype=torch.int32)
    out = torch.empty(q_index.shape[0], 40)
    call = (q_index, weights, index_pages, table, req, pos, zeros, 40, out)
    for bad in (torch.zeros(5, 2, dtype=torch.int32), torch.zeros(5, 3, dtype=torch.int64)):
        with pytest.raises(ValueError, match=r"\(gluon\): maxima expected an int32 \[5, >= 3\] tensor"):
            indexer_gluon.launch(*call, starts=zeros, group=1, refusal_checked=True, maxima=bad)
    with pytest.raises(ValueError, match=r"\(gluon\): maxima_group expected one of \(8, 16, 32, 64\), got 24"):
        indexer_gluon.launch(*call, starts=zeros, group=1, refusal_checked=True, maxima=zeros.view(5, 1),
                             maxima_group=24)


def test_the_h200_check_scripts_cpu_smoke_run():
    script = os.path.join(HERE, "..", "scripts", "h200", "fused_maxima_check.py")
    done = subprocess.run([sys.executable, script, "--cpu-smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 x 3 at 300, fp8 keys: ok" in done.stdout, done.stdout


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
