"""Launchers that put a call-size count on grid axis 1 or 2 stay within CUDA's 65,535 programs there.

CUDA refuses a launch with more than 65,535 programs along grid axis 1 or 2. The launchers of
``positions_to_slots``, ``indexer_score``, ``sparse_mla`` and ``sparse_mla_small_heads`` put the query
tokens (and ``sparse_mla`` its slot-list splits) there; past the limit they launch the same kernel once
per range of :func:`dsahal.backends.triton_kernels.grid.ranges`, on sub-views of the per-token tensors.

Under ``TRITON_INTERPRET=1`` (a child process, :mod:`interpreter_child`) the child lowers
``grid.MAX_GRID_YZ`` to 2 or 3 and checks that every launcher gives bitwise the outputs of one launch at
the real limit, on small random inputs (token and split counts that are not multiples of the tiny
limit), with the expected number of launches, every grid axis beyond 0 within the tiny limit, and the
one-launch outputs equal to the float64 reference within fp32 rounding (so the compared outputs are
real scores, not two copies of garbage). Outputs come from a NaN-filled ``torch.empty``
(:func:`interpreter_child.poisoned_empty`): an element no launch writes stays NaN and fails the bitwise
comparison. The indexer case has segments (``group=4`` tokens of one request) that cross range
boundaries: a range's last tokens belong to a segment whose first token is in that range.

In this process, with the kernels replaced by recorders (nothing runs), calls just past the real limit
must launch grids within 65,535, and calls that fit must launch once with the grid of before. The module
takes ~15 s on two cores.
"""
from __future__ import annotations

import contextlib
import json

import pytest

from interpreter_child import child_results, poisoned_empty, run_groups

CUDA_LIMIT = 65535
REF_TOL = 1e-5  # one launch vs the float64 reference (max rel): fp32 rounding


# ----------------------------------------------------------------------------------------------------
# Child process (TRITON_INTERPRET=1)


class _Counting:
    """Stands in for a module's ``*_kernel``: records each launch's grid, then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.grids: list[tuple] = []

    def __getitem__(self, grid):
        self.grids.append(tuple(grid))
        return self.kernel[grid]


@contextlib.contextmanager
def _counted(module, name, limit):
    """``module.name`` counted, ``grid.MAX_GRID_YZ`` set to ``limit`` and ``torch.empty`` NaN-filled in
    ``module`` for the block; yields the counter."""
    from dsahal.backends.triton_kernels import grid

    real_kernel, real_limit = getattr(module, name), grid.MAX_GRID_YZ
    counter = _Counting(real_kernel)
    setattr(module, name, counter)
    grid.MAX_GRID_YZ = limit
    try:
        with poisoned_empty(module):
            yield counter
    finally:
        setattr(module, name, real_kernel)
        grid.MAX_GRID_YZ = real_limit


def _bits_equal(a, b) -> bool:
    """Same dtype, shape and values, bit for bit (NaN never equals: an unwritten element fails)."""
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _rel(a, b) -> float:
    finite = b.isfinite()
    if not bool((a.isfinite() == finite).all()):
        return float("inf")
    a, b = a[finite].double(), b[finite].double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(module, name, call, limit, results, label, reference=None):
    """``call()`` with the real limit, then with ``limit``: ``results[label]``, a dict of what the tests
    check. ``call`` returns a tuple of output tensors; ``reference`` (optional) the float64 oracle's."""
    from dsahal.backends.triton_kernels import grid

    with _counted(module, name, grid.MAX_GRID_YZ) as once:
        whole = call()
    with _counted(module, name, limit) as chunked:
        parts = call()
    entry = dict(
        same_bits=all(_bits_equal(a, b) for a, b in zip(whole, parts)) and len(whole) == len(parts),
        launches=[len(once.grids), len(chunked.grids)],
        one_launch_grid=list(once.grids[0]) if once.grids else [],
        chunked_max_axes=[max(g[axis] for g in chunked.grids) if chunked.grids else 0 for axis in (1, 2)
                          if all(len(g) > axis for g in chunked.grids)],
        finite_somewhere=all(bool(t.isfinite().any()) for t in whole),
    )
    if reference is not None:
        want = reference()
        entry["ref_err"] = max(_rel(got.float(), ref.float()) for got, ref in zip(whole, want))
    results[label] = entry


def _slots_cases(results):
    import torch

    from dsahal.backends.triton_kernels import slots as module
    from dsahal.reference.slots import positions_to_slots as reference

    table = torch.tensor([[3, 1, 0, -1], [2, 4, 6, 5], [7, -1, 9, 8]], dtype=torch.int32)
    positions = torch.randint(-1, 70, (7, 30), dtype=torch.int32)  # 64..69: past the table
    req = torch.tensor([0, 2, 1, 1, 0, 2, 1], dtype=torch.int32)
    safe = torch.where(positions >= 64, -1, positions)

    def call():
        return (module.positions_to_slots(positions, req, table, 16),)

    # the kernel's output is int32 (torch.empty is then not poisoned): ints are checked exactly instead
    _compare(module, "positions_to_slots_kernel", call, 3, results, "slots")
    results["slots"]["ref_exact"] = torch.equal(call()[0], reference(safe, req, table, 16))
    results["slots"]["mapped_somewhere"] = bool((call()[0] >= 0).any())


def _indexer_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer as module
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    pages = index_format("fp8").pack(torch.randn(10 * 16, 128)).view(10, 16, -1)
    table = torch.tensor([[3, 1, 0], [2, 9, 6], [5, 8, 7]], dtype=torch.int32)
    # requests in runs of 5, 2 and 4 tokens; group=4 makes segments [0..3], [4], [5, 6], [7..10]: with 3
    # tokens per range, [0..3] and [7..10] cross from one range into the next
    req = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2], dtype=torch.int32)
    pos = torch.tensor([20, 21, 22, 23, 24, 5, 6, 30, 31, 32, 47], dtype=torch.int32)
    q = torch.randn(11, 4, 128).to(torch.float8_e4m3fn)  # fp8 on fp8 keys: the FP8 MMA (right in the interpreter)
    w = torch.rand(11, 4) + 0.1

    for label, extra in (("indexer", {}), ("indexer_pipelined", dict(pipeline=True, typed_keys=True))):
        def call(extra=extra):
            return (module.indexer_score(q, w, pages, table, req, pos, "fp8", 48, block_n=16, group=4, tiles=2,
                                         **extra),)

        _compare(module, "indexer_score_kernel", call, 3, results, label,
                 reference=lambda: (reference(q.float(), w, pages, table, req, pos, "fp8", 48),))


def _latents(fmt, slots_total):
    import torch

    from dsahal.formats import latent_format

    spec = latent_format(fmt)
    scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
    pages = spec.pack(torch.randn(slots_total, 576) * 2, scale).view(slots_total // 16, 16, -1)
    return pages, scale


def _sparse_mla_cases(results):
    import torch

    from dsahal.backends.triton_kernels import sparse_mla as module
    from dsahal.reference.sparse_mla import sparse_mla as reference

    pages, scale = _latents("bf16", 96)
    q = torch.randn(7, 16, 576)  # fp32: exact dots (the interpreter's bf16 dots are wrong)
    slots = torch.randint(-1, 96, (7, 72), dtype=torch.int32)  # 16-slot splits: 5, the last of 8 slots
    slots[2] = -1  # a row with no valid slot: o = 0, lse = -inf
    for label, split_size in (("sparse_mla_splits", 16), ("sparse_mla_one_split", None)):
        def call(split_size=split_size):
            return module.sparse_mla(q, pages, slots, "bf16", scale, 0.08, block_h=16, block_n=16,
                                     split_size=split_size)

        _compare(module, "sparse_mla_kernel", call, 2, results, label,
                 reference=lambda: reference(q, pages, slots, "bf16", scale, 0.08))


def _small_heads_cases(results):
    import torch

    from dsahal.backends.triton_kernels import sparse_mla_small_heads as module
    from dsahal.reference.sparse_mla import sparse_mla as reference

    pages, scale = _latents("fp8_ds_mla", 80)
    q = torch.randn(7, 4, 576)
    slots = torch.randint(-1, 80, (7, 40), dtype=torch.int32)  # 16-slot splits: 3, the last of 8 slots
    for label, split_size in (("small_heads_splits", 16), ("small_heads_one_split", None)):
        def call(split_size=split_size):
            return module.sparse_mla_small_heads(q, pages, slots, "fp8_ds_mla", scale, 0.08, block_n=16,
                                                 split_size=split_size, gather_first=False)

        _compare(module, "sparse_mla_small_heads_kernel", call, 3, results, label,
                 reference=lambda: reference(q, pages, slots, "fp8_ds_mla", scale, 0.08))


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_slots_cases, _indexer_cases, _sparse_mla_cases, _small_heads_cases), normalise=False)


# ----------------------------------------------------------------------------------------------------
# Tests (parent process)


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


# label -> (launches at the tiny limit, tiny limit, one-launch grid axes 1 and 2)
EXPECTED = {
    "slots": (3, 3, [7]),  # 7 tokens: 3 + 3 + 1
    "indexer": (4, 3, [11]),  # 11 tokens: 3 + 3 + 3 + 2
    "indexer_pipelined": (4, 3, [11]),
    "sparse_mla_splits": (12, 2, [7, 5]),  # 7 tokens x 5 splits: (2 + 2 + 2 + 1) x (2 + 2 + 1)
    "sparse_mla_one_split": (4, 2, [7, 1]),
    "small_heads_splits": (3, 3, [7]),  # splits on axis 0 (unlimited): tokens only
    "small_heads_one_split": (3, 3, [7]),
}


@pytest.mark.parametrize("label", list(EXPECTED))
def test_chunked_launches_give_the_bits_of_one_launch(interpreted, label):
    entry = interpreted[label]
    launches, limit, axes = EXPECTED[label]
    assert entry["launches"] == [1, launches], (
        f"{label}: launches at the real limit / at a limit of {limit}: {entry['launches']}, expected [1, {launches}]")
    assert entry["one_launch_grid"][1:] == axes, (
        f"{label}: one launch's grid {entry['one_launch_grid']}, expected axes 1.. = {axes} (the grid of before)")
    assert entry["chunked_max_axes"] and max(entry["chunked_max_axes"]) <= limit, (
        f"{label}: a chunked launch has {entry['chunked_max_axes']} programs on axes 1/2, limit {limit}")
    assert entry["same_bits"], f"{label}: chunked launches gave other bits than one launch (or left an element unwritten)"
    assert entry["finite_somewhere"], f"{label}: every output element is non-finite: the comparison is vacuous"


@pytest.mark.parametrize("label", [k for k in EXPECTED if k != "slots"])
def test_the_compared_outputs_match_the_reference(interpreted, label):
    err = interpreted[label]["ref_err"]
    assert err < REF_TOL, f"{label}: one launch vs float64 reference max rel err {err:.3e} (tol {REF_TOL})"


def test_chunked_slots_match_the_reference_exactly(interpreted):
    entry = interpreted["slots"]
    assert entry["ref_exact"], "positions_to_slots: the slots differ from the reference's"
    assert entry["mapped_somewhere"], "positions_to_slots: no position mapped to a slot: the comparison is vacuous"


def test_ranges_cover_the_count_in_order():
    from dsahal.backends.triton_kernels import grid

    assert grid.MAX_GRID_YZ == CUDA_LIMIT
    assert grid.ranges(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert grid.ranges(6, 3) == [(0, 3), (3, 6)]
    assert grid.ranges(0, 3) == []
    assert grid.ranges(CUDA_LIMIT * 2 + 1) == [(0, CUDA_LIMIT), (CUDA_LIMIT, 2 * CUDA_LIMIT),
                                                (2 * CUDA_LIMIT, 2 * CUDA_LIMIT + 1)]
    with pytest.raises(ValueError, match=r"grid.ranges: limit expected >= 1.*got 0"):
        grid.ranges(5, 0)
    with pytest.raises(ValueError, match=r"grid.ranges: count expected >= 0, got -1"):
        grid.ranges(-1)


# ----------------------------------------------------------------------------------------------------
# The real limit, with recorders (parent process: nothing runs)


class _Recorder:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launches.append((tuple(grid), args))


def _within_cuda_limit(launches):
    return all(all(axis <= CUDA_LIMIT for axis in grid[1:]) for grid, _ in launches)


@pytest.mark.parametrize("tokens, launches", [(CUDA_LIMIT, 1), (CUDA_LIMIT + 1, 2), (2 * CUDA_LIMIT + 7, 3)])
def test_positions_to_slots_splits_tokens_at_the_cuda_limit(monkeypatch, tokens, launches):
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import slots

    recorder = _Recorder()
    monkeypatch.setattr(slots, "positions_to_slots_kernel", recorder)
    positions = torch.zeros(tokens, 3, dtype=torch.int32)
    slots.positions_to_slots(positions, torch.zeros(tokens, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                             16)
    assert len(recorder.launches) == launches and _within_cuda_limit(recorder.launches), (
        f"positions_to_slots, {tokens} tokens: grids {[g for g, _ in recorder.launches]}")
    assert sum(g[1] for g, _ in recorder.launches) == tokens
    if launches == 1:  # a call that fits: the launch of before, on the whole tensors
        assert recorder.launches[0][1][0] is positions


@pytest.mark.parametrize("tokens, launches", [(CUDA_LIMIT, 1), (CUDA_LIMIT + 3, 2)])
def test_indexer_score_splits_tokens_at_the_cuda_limit(monkeypatch, tokens, launches):
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import indexer

    recorder = _Recorder()
    monkeypatch.setattr(indexer, "indexer_score_kernel", recorder)
    monkeypatch.setattr(indexer, "run_offsets", torch.zeros_like)  # its kernel needs a GPU or the interpreter
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16).expand(tokens, 4, 128)  # one row, no memory per token
    ids = torch.zeros(tokens, dtype=torch.int32)
    indexer.indexer_score(q, torch.zeros(1, 4).expand(tokens, 4), torch.zeros(2, 16, 132, dtype=torch.uint8),
                          torch.zeros(1, 2, dtype=torch.int32), ids, ids, "fp8", 16)
    grids = [g for g, _ in recorder.launches]
    assert len(grids) == launches and _within_cuda_limit(recorder.launches), f"indexer_score: grids {grids}"
    assert sum(g[1] for g in grids) == tokens
    # each launch's T (the tokens from its range's start to the call's end) lets a segment reach past it
    t_args = [args[-6] for _, args in recorder.launches]
    assert t_args == [tokens - start for start in range(0, tokens, CUDA_LIMIT)], f"indexer_score: T arguments {t_args}"


@pytest.mark.parametrize("tokens, k, split_size, launches",
                         [(CUDA_LIMIT, 4, None, 1), (CUDA_LIMIT + 1, 4, None, 2), (1, CUDA_LIMIT + 2, 1, 2)])
def test_sparse_mla_splits_tokens_and_splits_at_the_cuda_limit(monkeypatch, tokens, k, split_size, launches):
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import sparse_mla

    recorder = _Recorder()
    monkeypatch.setattr(sparse_mla, "sparse_mla_kernel", recorder)
    combined = []
    monkeypatch.setattr(sparse_mla, "lse_combine", lambda o, lse, out_dtype: combined.append(o.shape) or (o[0], lse[0]))
    q = torch.zeros(1, 1, 576, dtype=torch.float16).expand(tokens, 1, 576)
    slots = torch.zeros(1, k, dtype=torch.int32).expand(tokens, k)
    sparse_mla.sparse_mla(q, torch.zeros(1, 16, 1152, dtype=torch.uint8), slots, "bf16", None, 0.1, block_h=16,
                          split_size=split_size)
    grids = [g for g, _ in recorder.launches]
    assert len(grids) == launches and _within_cuda_limit(recorder.launches), f"sparse_mla: grids {grids}"
    splits = 1 if split_size is None else -(-k // split_size)
    assert sum(g[1] * g[2] for g in grids) == tokens * splits
    assert combined == ([] if splits == 1 else [(splits, tokens, 1, 512)])


@pytest.mark.parametrize("tokens, launches", [(CUDA_LIMIT, 1), (CUDA_LIMIT + 1, 2)])
def test_small_heads_splits_tokens_at_the_cuda_limit(monkeypatch, tokens, launches):
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import sparse_mla_small_heads as small

    recorder = _Recorder()
    monkeypatch.setattr(small, "sparse_mla_small_heads_kernel", recorder)
    q = torch.zeros(1, 4, 576, dtype=torch.float16).expand(tokens, 4, 576)
    slots = torch.zeros(1, 8, dtype=torch.int32).expand(tokens, 8)
    small.sparse_mla_small_heads(q, torch.zeros(1, 16, 1152, dtype=torch.uint8), slots, "bf16", None, 0.1,
                                 split_size=None)
    grids = [g for g, _ in recorder.launches]
    assert len(grids) == launches and _within_cuda_limit(recorder.launches), f"sparse_mla_small_heads: grids {grids}"
    assert sum(g[1] for g in grids) == tokens


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton is imported.
    print(json.dumps(_run_all()))
