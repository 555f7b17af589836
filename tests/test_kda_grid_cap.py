"""The KDA kernels put ``sequences x heads`` programs on grid axis 1, which CUDA caps at 65,535 (2,048
decode requests of 32 heads would be 65,536): past the cap the launchers split the call into ranges of
sequences (:func:`dsahal.backends.triton_kernels.kda.sequence_ranges`). Under the interpreter, with the cap
lowered to a few programs, every launcher gives bitwise the same outputs and pool as in one launch, and
launches once per range.

Covered: the recurrent kernel in decode and varlen prefill form, the one-step decode kernel (``scalar_row``),
and the chunked prefill's pass B (its ranges start at a sequence offset ``seq0`` into the scratch), each with a
padding id among the requests.
"""
from __future__ import annotations

import json

import pytest
import torch

from interpreter_child import child_results, run_groups

HEADS, KEY_DIM, VALUE_DIM = 2, 16, 16
CAP = 3  # programs on axis 1 per launch: 1 sequence of 2 heads per range
LENGTHS = [5, 1, 17, 0, 9]  # prefill; a sequence of 17 spans two chunks of 16
IDS = [4, -1, 0, 2, 6]  # a padding request; pool rows 1, 3, 5 idle


def _inputs(tokens, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(tokens, HEADS, KEY_DIM, generator=gen) for _ in range(2))
    v = torch.randn(tokens, HEADS, VALUE_DIM, generator=gen)
    g = -0.05 - 0.3 * torch.rand(tokens, HEADS, KEY_DIM, generator=gen)
    beta = 0.1 + 0.8 * torch.rand(tokens, HEADS, generator=gen)
    pool = 0.2 * torch.randn(7, HEADS, KEY_DIM, VALUE_DIM, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, beta.to(dtype)], pool


def _count_launches(module, names, counts):
    """Wrap ``module``'s kernels ``names``, counting their launches into ``counts`` (the wrappers stay)."""
    counts.update({name: 0 for name in names})
    for name in names:
        kernel = getattr(module, name)

        class Counted:
            def __init__(self, kernel, name):
                self.kernel, self.name = kernel, name

            def __getitem__(self, grid):
                counts[self.name] += 1
                assert all(axis <= CAP for axis in grid[1:]), f"{self.name}: grid {grid} past the cap {CAP}"
                return self.kernel[grid]

        setattr(module, name, Counted(kernel, name))


def _cases(results):
    from dsahal.backends.triton_kernels import grid, kda, kda_chunk

    scale = KEY_DIM ** -0.5
    ids = torch.tensor(IDS, dtype=torch.int32)
    cu = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist(), dtype=torch.int32)
    calls = {
        "decode_recurrent": lambda t, p: kda.kda_decode(*t, p, ids, scale, True),
        "decode_step": lambda t, p: kda.kda_decode(*t, p, ids, scale, True, scalar_row=True),
        "prefill_recurrent": lambda t, p: kda.kda_prefill_recurrent(*t, cu, p, ids, scale, True),
        "prefill_chunked": lambda t, p: kda_chunk.kda_prefill_chunked(*t, cu, p, ids, scale, True, block_v=16,
                                                                       operands="fp32"),
    }
    one = {}
    for n, (name, call) in enumerate(calls.items()):
        tokens = len(IDS) if name.startswith("decode") else sum(LENGTHS)
        tensors, pool = _inputs(tokens, 10 + n)
        one[name] = (tensors, pool.clone(), call(tensors, pool), pool)
    saved = grid.MAX_GRID_YZ
    grid.MAX_GRID_YZ = CAP
    try:
        counts = {}
        _count_launches(kda, ["kda_recurrent_kernel", "kda_decode_step_kernel"], counts)
        _count_launches(kda_chunk, ["kda_chunk_state_kernel"], counts)
        kernel_of = {"decode_recurrent": "kda_recurrent_kernel", "decode_step": "kda_decode_step_kernel",
                     "prefill_recurrent": "kda_recurrent_kernel", "prefill_chunked": "kda_chunk_state_kernel"}
        for name, call in calls.items():
            tensors, pool_before, want, want_pool = one[name]
            pool = pool_before.clone()
            before = counts[kernel_of[name]]
            got = call(tensors, pool)
            results[f"{name}_out_equal"] = bool(torch.equal(got, want))
            results[f"{name}_pool_equal"] = bool(torch.equal(pool, want_pool))
            results[f"{name}_launches"] = counts[kernel_of[name]] - before
    finally:
        grid.MAX_GRID_YZ = saved


def _run_all() -> dict:
    return run_groups((_cases,), keep=(str, int))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("name", ["decode_recurrent", "decode_step", "prefill_recurrent", "prefill_chunked"])
def test_a_call_past_the_grid_cap_runs_in_ranges_with_the_same_result(interpreted, name):
    assert interpreted[f"{name}_launches"] == len(IDS), (f"{name}: {interpreted[f'{name}_launches']} launches, "
                                                         f"expected one per sequence ({len(IDS)}) at a cap of {CAP}")
    assert interpreted[f"{name}_out_equal"], f"{name}: the output differs from the one-launch call"
    assert interpreted[f"{name}_pool_equal"], f"{name}: the state pool differs from the one-launch call"


def test_sequence_ranges_cover_every_sequence_once_within_the_cap():
    pytest.importorskip("triton")
    from dsahal.backends.triton_kernels.kda import sequence_ranges

    assert sequence_ranges(2048, 32) == [(0, 2047), (2047, 2048)]  # 65,536 programs: two launches
    assert sequence_ranges(64, 32) == [(0, 64)]
    assert sequence_ranges(0, 32) == []
    for sequences, heads, cap in ((10, 3, 7), (5, 1, 2), (9, 4, 4), (3, 8, 5)):
        ranges = sequence_ranges(sequences, heads, cap)
        covered = [s for first, last in ranges for s in range(first, last)]
        assert covered == list(range(sequences)), (sequences, heads, cap, ranges)
        assert all((last - first) * heads <= max(cap, heads) for first, last in ranges)


if __name__ == "__main__":
    print(json.dumps(_run_all()))
