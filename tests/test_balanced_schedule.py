"""The balanced schedule of the wgmma sparse-MLA kernels (``triton_kernels.balanced``): its plain-Python model, and
the kernels' Gluon twins (``sparse_mla_wgmma.program_steps`` / ``piece``) run against it. Gluon has no interpreter, so
the twins' own code objects run in a Triton kernel under ``TRITON_INTERPRET=1`` (in a child process: the variable must
be set before triton's import) with ``gl`` bound to ``triton.language``: the same integer arithmetic, the same lines."""
import json

import pytest
from interpreter_child import child_results, run_groups

from dsahal.backends.triton_kernels import balanced

CASES = [(320, 2048, 264), (512, 2048, 264), (64, 2048, 264), (16, 2048, 264), (1, 2048, 264), (3, 300, 7),
         (5, 64, 11), (7, 1, 3), (1000, 4096, 396), (2, 130, 264), (13, 2000, 37), (264, 2048, 264)]


@pytest.mark.parametrize("tokens, k, programs", CASES)
def test_every_step_of_every_row_is_reduced_once_in_parts_the_merge_can_hold(tokens, k, programs):
    steps = balanced.steps_per_row(k)
    running = balanced.launch_programs(tokens, k, programs)
    assert 1 <= running <= min(programs, tokens * steps)
    bound = balanced.parts_bound(tokens, k, programs)
    seen = {}
    parts_of = {t: [] for t in range(tokens)}
    for p in range(running):
        mine = balanced.pieces(p, tokens, k, programs)
        assert mine, f"program {p} has no step"  # (never more programs than steps)
        sizes = []
        for t, start, end, part in mine:
            assert start % balanced.TILE == 0 and 0 <= start < end <= k  # whole steps; ALIGNED holds
            assert 0 <= part < bound
            parts_of[t].append((part, p, start, end))
            for step in range(start // balanced.TILE, -(-end // balanced.TILE)):
                assert (t, step) not in seen, f"row {t} step {step} in programs {seen.get((t, step))} and {p}"
                seen[(t, step)] = p
            sizes.append(-(-end // balanced.TILE) - start // balanced.TILE)
        # a program's share is W // P or one more steps, its rows consecutive
        assert sum(sizes) in (tokens * steps // running, tokens * steps // running + 1)
        assert [t for t, *_ in mine] == list(range(mine[0][0], mine[0][0] + len(mine)))
    assert len(seen) == tokens * steps
    for t, got in parts_of.items():
        got.sort()
        # a row's parts are 0, 1, ... in slot order (the merge visits them in part order), its last one ends the row
        assert [part for part, *_ in got] == list(range(len(got)))
        assert [start for _, _, start, _ in got] == sorted(start for _, _, start, _ in got)
        assert got[-1][3] == k and got[0][2] == 0


def test_the_bound_is_met_by_some_row_where_programs_are_short():
    """The parts bound is tight enough to size the partials by: some row of a call with short programs reaches
    within one of it."""
    tokens, k, programs = 64, 2048, 264
    bound = balanced.parts_bound(tokens, k, programs)
    most = max(len([1 for p in range(balanced.launch_programs(tokens, k, programs))
                    for t, *_ in balanced.pieces(p, tokens, k, programs) if t == row]) for row in range(tokens))
    assert most <= bound <= most + 1


def test_the_first_program_of_a_step_is_the_one_whose_share_holds_it():
    total, programs = 10240, 264
    for g in (0, 1, 37, 38, 39, 5000, total - 1):
        p = balanced.first_program(g, total, programs)
        assert p * total // programs <= g < (p + 1) * total // programs


TWIN_CASES = [(13, 2000, 37), (320, 2048, 264), (64, 2048, 264), (3, 300, 7), (7, 1, 3), (2, 130, 264), (1, 64, 5)]
MOST_PIECES = 40  # pieces a program records (the cases' programs meet at most this many rows)


def _twin_cases(results):
    import types

    import torch
    import triton
    import triton.language as tl

    from dsahal.backends.triton_kernels import sparse_mla_wgmma

    def as_tl(jitted):
        """A Gluon function's code object with ``gl`` (and its constexprs) bound to ``triton.language``'s."""
        fn = jitted.fn
        names = dict(fn.__globals__, gl=tl, TILE=tl.constexpr(balanced.TILE))
        return triton.jit(types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__))

    # (module globals: a jit'd kernel finds the functions it calls there)
    globals().update(program_steps=as_tl(sparse_mla_wgmma.program_steps), piece=as_tl(sparse_mla_wgmma.piece))

    @triton.jit
    def record_pieces(out_ptr, tokens, K, MOST: tl.constexpr):
        """Program p's pieces as the kernels' loop runs them: ``out [P, MOST, 4]`` (row, start, end, part)."""
        g0, g1, S, total = program_steps(tokens, K)  # noqa: F821 - bound above
        n = 0
        for t in range(g0 // S, (g1 - 1) // S + 1):
            start, end, part = piece(t, g0, g1, S, total, K)  # noqa: F821 - bound above
            row = out_ptr + (tl.program_id(0) * MOST + n) * 4
            tl.store(row, t)
            tl.store(row + 1, start)
            tl.store(row + 2, end)
            tl.store(row + 3, part)
            n += 1

    for tokens, k, programs in TWIN_CASES:
        running = balanced.launch_programs(tokens, k, programs)
        out = torch.full((running, MOST_PIECES, 4), -1, dtype=torch.int32)
        record_pieces[(running,)](out, tokens, k, MOST=MOST_PIECES)
        results[f"twin_{tokens}_{k}_{programs}"] = all(
            [tuple(r) for r in out[p].tolist() if r[0] >= 0] == list(balanced.pieces(p, tokens, k, programs))
            for p in range(running))


MERGE_CASES = [(9, 300, 7), (4, 130, 264), (6, 64, 4)]


def _merge_cases(results):
    """The schedule's partials, merged as the launcher merges them, give each whole row: every piece reduced alone
    (the float64 reference on its slots), stored as its part; a row's unused parts left holding garbage (NaN) with
    ``lse = -inf``, as the kernels' last piece marks them; then ``lse_combine`` (interpreted) in part order."""
    import torch

    from dsahal.backends.triton_kernels.lse_combine import lse_combine
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    gen = torch.Generator().manual_seed(3)
    spec = latent_format("bf16")
    pages = spec.pack(torch.randn(40 * 16, 576, generator=gen) + 1e-3).view(40, 16, -1)
    for tokens, k, programs in MERGE_CASES:
        heads = 3
        q = torch.randn(tokens, heads, 576, generator=gen)
        slots = torch.randint(-1, 40 * 16, (tokens, k), generator=gen, dtype=torch.int32)
        slots[-1] = -1  # a row with no valid slot
        parts = balanced.parts_bound(tokens, k, programs)
        o_parts = torch.full((parts, tokens, heads, 512), float("nan"))
        lse_parts = torch.full((parts, tokens, heads), float("nan"))
        for p in range(balanced.launch_programs(tokens, k, programs)):
            for t, start, end, part in balanced.pieces(p, tokens, k, programs):
                piece_slots = torch.full((1, k), -1, dtype=torch.int32)
                piece_slots[0, start:end] = slots[t, start:end]
                o_parts[part, t], lse_parts[part, t] = (x[0].float() for x in reference(
                    q[t:t + 1].double(), pages, piece_slots, "bf16", None, 0.1))
                if end == k:
                    lse_parts[part + 1:, t] = float("-inf")
        o, lse = lse_combine(o_parts, lse_parts)
        want_o, want_lse = reference(q.double(), pages, slots, "bf16", None, 0.1)
        finite = torch.isfinite(want_lse)
        results[f"merge_{tokens}_{k}_{programs}"] = bool(
            torch.allclose(o.double(), want_o, atol=1e-5, rtol=1e-4) and (o[-1] == 0).all()
            and torch.equal(torch.isfinite(lse), finite)
            and torch.allclose(lse[finite].double(), want_lse[finite].double(), atol=1e-5))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("tokens, k, programs", TWIN_CASES)
def test_the_kernels_gluon_twins_run_the_models_schedule(interpreted, tokens, k, programs):
    assert interpreted[f"twin_{tokens}_{k}_{programs}"]


@pytest.mark.parametrize("tokens, k, programs", MERGE_CASES)
def test_a_rows_pieces_merged_in_part_order_are_the_whole_row(interpreted, tokens, k, programs):
    assert interpreted[f"merge_{tokens}_{k}_{programs}"]


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(run_groups((_twin_cases, _merge_cases))))
