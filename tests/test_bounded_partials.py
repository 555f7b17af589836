"""Split sparse-MLA launches keep their fp32 partials within a budget (:mod:`dsahal.backends.triton_kernels.partials`).

A launcher with a fixed split (batch-invariant mode; few heads) allocates ``[splits, T, H, 512]`` fp32 partials: 17 GiB
for a 16K-token prefill at 128 heads. Past ``PARTIALS_BUDGET_BYTES`` it runs over token ranges instead. Here: the
arithmetic and the decorator on a recording launcher (in this process), every split launcher of the package bounded,
and, under ``TRITON_INTERPRET=1`` in a child process, the general and few-heads kernels with the budget lowered to two
tokens a launch: bitwise the outputs of one launch, the expected number of launches, and the float64 reference's
result (so the compared outputs are real).
"""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from interpreter_child import child_results, run_groups

from dsahal.backends.triton_kernels import partials

SPLIT_LAUNCHERS = {
    "sparse_mla": "sparse_mla",
    "sparse_mla_small_heads": "sparse_mla_small_heads",
    "sparse_mla_small_heads_raw": "sparse_mla_small_heads_raw",
    "sparse_mla_gluon": "sparse_mla_gluon",
    "sparse_mla_wgmma": "sparse_mla_wgmma",
    "sparse_mla_wgmma_fp4": "sparse_mla_wgmma_fp4",
}


def test_the_partials_of_a_long_invariant_prefill_are_bounded(monkeypatch):
    monkeypatch.setattr(partials, "PARTIALS_BUDGET_BYTES", 512 * 2**20)  # the default (DSAHAL_SCRATCH_MIB unset)
    # 128 heads, top-k 2048 in 512-slot splits (batch-invariant mode): 4 splits, ~1 MiB a token
    per_token = partials.partial_bytes_per_token(128, 2048, 512)
    assert per_token == 4 * 128 * 513 * 4
    most = partials.tokens_per_launch(128, 2048, 512)
    assert most * per_token <= partials.PARTIALS_BUDGET_BYTES < (most + 1) * per_token
    assert 16384 * per_token > 16 * 2**30  # what one launch of a 16K-token prefill would have allocated
    assert most >= 320  # the seed's 64 x 5 decode batch still launches once
    # one split writes its output final: nothing to bound
    assert partials.tokens_per_launch(128, 2048, None) is None
    assert partials.tokens_per_launch(128, 2048, 4096) is None
    assert partials.splits_of(2049, 512) == 5 and partials.splits_of(7, None) == 1
    # not a split size: left to the launcher, which names it (tests/test_sparse_mla_gluon.py and others)
    assert partials.splits_of(2048, 0) == partials.splits_of(2048, -4) == partials.splits_of(2048, 1.5) == 1


def _recording_launcher(calls):
    def launcher(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, split_size=4, tag=None):
        calls.append((q.shape[0], split_size, tag))
        o = q[:, :, :512].to(torch.float16) + slots[:, :1, None].to(torch.float16)
        return o, q[:, :, 0].float() * 2

    return launcher


def test_a_call_past_the_budget_runs_over_token_ranges_with_the_calls_options(monkeypatch):
    calls = []
    launch = partials.bounded_partials(_recording_launcher(calls))
    q, slots = torch.randn(7, 3, 576), torch.randint(0, 50, (7, 10))
    want_o, want_lse = _recording_launcher([])(q, None, slots, "bf16", None, 0.1)
    # 10 slots in splits of 4: 3 splits; a budget of 3 tokens' partials
    monkeypatch.setattr(partials, "PARTIALS_BUDGET_BYTES", 3 * partials.partial_bytes_per_token(3, 10, 4))
    o, lse = launch(q, None, slots, "bf16", None, 0.1, tag="x")
    assert [c[0] for c in calls] == [3, 3, 1] and all(c[1:] == (4, "x") for c in calls)
    assert o.dtype == torch.float16 and torch.equal(o, want_o) and torch.equal(lse, want_lse)
    calls.clear()  # the call's own split_size: one split, no bound
    launch(q, None, slots, "bf16", None, 0.1, split_size=None)
    assert [c[0] for c in calls] == [7]
    calls.clear()  # within the budget: one launch
    launch(q[:3], None, slots[:3], "bf16", None, 0.1)
    assert [c[0] for c in calls] == [3]


def test_a_call_of_other_shapes_goes_to_the_launcher_whole(monkeypatch):
    calls = []
    launch = partials.bounded_partials(_recording_launcher(calls))
    monkeypatch.setattr(partials, "PARTIALS_BUDGET_BYTES", 1)  # every shaped call would be cut into tokens
    q = torch.randn(3, 2, 576)
    for slots in (torch.zeros(4, 10, dtype=torch.int32), torch.zeros(30, dtype=torch.int32)):  # T differs; 1-d
        with pytest.raises(Exception):  # (the stand-in launcher's own failure: it is not reached through ranges)
            launch(q, None, slots, "bf16", None, 0.1)
    assert calls == [(3, 4, None), (3, 4, None)]


@pytest.mark.parametrize("module", sorted(SPLIT_LAUNCHERS))
def test_every_split_launcher_bounds_its_partials(module):
    pytest.importorskip("triton")
    mod = importlib.import_module(f"dsahal.backends.triton_kernels.{module}")
    assert getattr(getattr(mod, SPLIT_LAUNCHERS[module]), "bounded_partials", False), module


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


class _Counting:
    """Stands in for a module's ``*_kernel``: counts launches, then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def _cases(results):
    from dsahal.backends.triton_kernels import sparse_mla as general
    from dsahal.backends.triton_kernels import sparse_mla_small_heads as few
    from dsahal.backends.triton_kernels import sparse_mla_small_heads_raw as raw
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    tokens, heads, k, split = 5, 16, 37, 16  # 3 splits; 5 tokens in launches of 2, 2 and 1
    # (name, module, its kernel, launcher, format, options, tolerance of o and lse against the reference)
    cases = (("general_fp8_ds_mla", general, "sparse_mla_kernel", general.sparse_mla, "fp8_ds_mla",
              dict(block_h=16, block_n=16), (1e-5, 1e-4)),
             ("general_nvfp4", general, "sparse_mla_kernel", general.sparse_mla, "nvfp4", dict(block_h=16, block_n=16),
              (1e-5, 1e-4)),
             ("few_heads_nvfp4", few, "sparse_mla_small_heads_kernel", few.sparse_mla_small_heads, "nvfp4",
              dict(block_n=16), (1e-5, 1e-4)),
             # raw e4m3 codes: fp16 queries and probabilities (tests/test_small_heads_raw.py's bounds)
             ("few_heads_raw_fp8_ds_mla", raw, "sparse_mla_small_heads_raw_kernel", few.sparse_mla_small_heads,
              "fp8_ds_mla", dict(block_n=16, raw_fp8=True), (1e-3, 2e-3)))
    for name, module, kernel_name, launch, fmt, options, (o_tol, lse_tol) in cases:
        spec = latent_format(fmt)
        pages = spec.pack(torch.randn(6 * 16, 576) * 2, None).view(6, 16, -1)
        q = torch.randn(tokens, heads, 576)
        slots = torch.randint(-1, 96, (tokens, k), dtype=torch.int32)
        want_o, want_lse = reference(q, pages, slots, fmt, None, 0.08)
        one_o, one_lse = launch(q, pages, slots, fmt, None, 0.08, split_size=split, **options)
        counter = _Counting(getattr(module, kernel_name))
        setattr(module, kernel_name, counter)
        real_budget = partials.PARTIALS_BUDGET_BYTES
        partials.PARTIALS_BUDGET_BYTES = 2 * partials.partial_bytes_per_token(heads, k, split)
        try:
            o, lse = launch(q, pages, slots, fmt, None, 0.08, split_size=split, **options)
        finally:
            setattr(module, kernel_name, counter.kernel)
            partials.PARTIALS_BUDGET_BYTES = real_budget
        results[f"{name}_launches"] = str(counter.launches)
        results[f"{name}_bitwise"] = bool(torch.equal(o, one_o) and torch.equal(lse, one_lse))
        rel = float((one_o.double() - want_o).norm() / want_o.norm())
        results[f"{name}_reference"] = rel < o_tol and bool((one_lse - want_lse).abs().max() < lse_tol)


def _run_all() -> dict:
    torch.manual_seed(0)
    return run_groups((_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


CASES = ("general_fp8_ds_mla", "general_nvfp4", "few_heads_nvfp4", "few_heads_raw_fp8_ds_mla")


@pytest.mark.parametrize("case", CASES)
def test_launches_over_token_ranges_give_one_launchs_bits(interpreted, case):
    assert interpreted[f"{case}_launches"] == "3"  # 2 + 2 + 1 tokens
    assert interpreted[f"{case}_bitwise"]
    assert interpreted[f"{case}_reference"]


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
