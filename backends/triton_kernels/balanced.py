"""The balanced schedule of the wgmma sparse-MLA kernels: a fixed number of programs share a call's 64-slot steps.

With fixed splits (``split_size`` slots a program) a call launches ``T · ceil(K / split_size)`` programs, and the GPU
runs them in waves of as many as fit at once (two or three a SM): 320 tokens x 2 splits = 640 programs are 2.4 waves
of 264 on 132 SMs, the last wave less than half full, so the call takes three waves' time for 2.4 waves' work (H100,
thirty-seventh session: 64 x 8 tokens, 3.9 waves, ran at 0.88x 64 x 5's time per token on the same kernel; the NVFP4
kernel's 64 x 5 and 64 x 8 times stood in the ratio of their wave counts, 2 : 3). The balanced schedule launches
``programs`` programs (as many as run at once) and gives each an equal share of the call's ``W = T · S`` steps (``S =
ceil(K / 64)`` a row), in row-major order: program ``p`` takes global steps ``[p W // P, (p + 1) W // P)``, which may
end one row and start the next. Each row's share of a program is a *piece*: it is reduced like a split (its own
online softmax over its slots) and written as one fp32 partial, part ``p - first(t)`` of row ``t``, where ``first(t)``
is the program holding the row's first step; the parts of a row are merged by ``lse_combine`` in part order. A row
has at most :func:`parts_bound` parts; the program holding a row's last step writes ``lse = -inf`` into the row's
unused parts, which the merge then skips without reading their outputs' values.

The pieces follow the batch (a row's split points move with the call's other rows), so batch-invariant mode keeps
the fixed splits. Steps are whole 64-slot tiles: a piece starts at a multiple of 64 slots (``ALIGNED`` holds).

:func:`pieces` is the schedule in plain Python: the tests' model of the kernels' Gluon twins
(``sparse_mla_wgmma.program_steps`` and ``piece``). This module imports no Triton: the launchers' host side uses it.
"""
from __future__ import annotations

TILE = 64  # slots a step


def steps_per_row(k: int) -> int:
    """64-slot steps of a row of ``k`` slots."""
    return -(-k // TILE)


def launch_programs(tokens: int, k: int, programs: int) -> int:
    """The programs a balanced launch runs: ``programs``, or one a step when the call has fewer steps."""
    return max(1, min(programs, tokens * steps_per_row(k)))


def parts_bound(tokens: int, k: int, programs: int) -> int:
    """The most parts a row can have: every program holds ``W // P`` or one more steps, so a row of ``S`` steps meets
    at most ``ceil(S / (W // P)) + 1`` programs (and never more than ``S``)."""
    s = steps_per_row(k)
    p = launch_programs(tokens, k, programs)
    return max(1, min(s, -(-s // ((tokens * s) // p)) + 1))


def first_program(g: int, total: int, programs: int) -> int:
    """The program holding global step ``g`` of ``total``: the largest ``p`` with ``p · total // programs <= g``."""
    return ((g + 1) * programs - 1) // total


def pieces(program: int, tokens: int, k: int, programs: int) -> list[tuple[int, int, int, int]]:
    """Program ``program``'s pieces: ``[(row, first slot, end slot, part), ...]`` in the order it runs them."""
    s = steps_per_row(k)
    total = tokens * s
    p = launch_programs(tokens, k, programs)
    g0, g1 = program * total // p, (program + 1) * total // p
    out = []
    for t in range(g0 // s, (g1 - 1) // s + 1) if g1 > g0 else ():
        s0, s1 = max(g0 - t * s, 0), min(g1 - t * s, s)
        out.append((t, s0 * TILE, min(s1 * TILE, k), program - first_program(t * s, total, p)))
    return out
