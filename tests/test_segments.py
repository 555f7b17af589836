"""The indexer's segment plan kernel (``backends/triton_kernels/segments.py``) against a plain torch oracle,
under ``TRITON_INTERPRET=1`` on the CPU (in a child process: see ``interpreter_child.py``).

Cases: decode batches (1-5 tokens per request), prefill runs longer than the segment and than one step of the
walk (so the run's first token and the segment count are carried between steps), a request split into two
runs by another, one token, and random ids.
"""
from __future__ import annotations

import pytest

from interpreter_child import child_results, run_groups

GROUPS = (1, 2, 5, 8)


def _oracle(req):
    """(run offsets, segment starts) by the definition, one token at a time."""
    offsets, starts = [], {}
    for t, r in enumerate(req):
        offsets.append(0 if t == 0 or req[t - 1] != r else offsets[-1] + 1)
    for group in GROUPS:
        first = [t for t, o in enumerate(offsets) if o % group == 0]
        starts[group] = first + [len(req)] * (len(req) - len(first))
    return offsets, starts


def _cases():
    import torch

    gen = torch.Generator().manual_seed(7)
    return {
        "decode": [r for r in range(6) for _ in range(1 + r % 5)],
        "prefill_long_runs": [3] * 40 + [1] * 3 + [0] * 37,  # 80 tokens: five steps of 16
        "split_run": [0, 0, 1, 0, 0, 0, 2, 2, 0, 2],
        "one_token": [4],
        "random": torch.randint(0, 3, (53,), generator=gen).tolist(),
    }


def _plan_cases(results):
    import torch

    from dsahal.backends.triton_kernels import segments

    # several steps of the walk on these small batches: 16-token steps up to 16 tokens, 32-token steps above
    segments.SMALL_BLOCK, segments.PLAN_BLOCK = 16, 32
    for name, req in _cases().items():
        ids = torch.tensor(req, dtype=torch.int32)
        want_offsets, want_starts = _oracle(req)
        results[f"offsets_{name}"] = segments.run_offsets(ids).tolist() == want_offsets
        for group in GROUPS:
            offsets, starts = segments.segment_plan(ids, group)
            results[f"plan_{name}_{group}"] = (offsets.tolist() == want_offsets
                                              and starts.tolist() == want_starts[group])
            again = segments.segment_starts(torch.tensor(want_offsets, dtype=torch.int32), group)
            results[f"starts_{name}_{group}"] = again.tolist() == want_starts[group]
    results["empty"] = [t.numel() for t in segments.segment_plan(torch.empty(0, dtype=torch.int32), 5)] == [0, 0]


def _run_all() -> dict:
    return run_groups((_plan_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


CASE_NAMES = ("decode", "prefill_long_runs", "split_run", "one_token", "random")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_run_offsets_match_the_definition(interpreted, name):
    assert interpreted[f"offsets_{name}"]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_segment_plan_in_one_launch_matches_the_definition(interpreted, name, group):
    assert interpreted[f"plan_{name}_{group}"]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_segment_starts_from_given_offsets(interpreted, name, group):
    assert interpreted[f"starts_{name}_{group}"]


def test_empty_batch_launches_nothing(interpreted):
    assert interpreted["empty"]


if __name__ == "__main__":
    import json

    print(json.dumps(_run_all()))
