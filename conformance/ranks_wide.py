"""Gloo ranks for the properties that need a wider group than :mod:`.distributed`'s (W = 2, 4).

The DCP merge at W >= 8 sends ``ceil(1.5k/W)`` candidates per rank, under k/5, so its resend path
(one rank owning more winners than it sent) only shows its sizing there. The wide pool is a
:class:`.distributed.RankPool` of :data:`WIDE_WORLD` ranks serving one group, all of them. Its processes start
on first use (seconds per rank: keep its users few) and stop with :func:`shutdown_wide_pool` (the test module's
fixture) or at exit.
"""
from __future__ import annotations

import atexit

from dsahal.conformance.distributed import RankPool, RankPoolError

WIDE_WORLD = 8

_POOL: RankPool | None = None


def run_on_wide_ranks(backend: str, name: str, per_rank_args: list) -> list[tuple]:
    """Like :func:`.distributed.run_on_ranks` on the wide pool (discarded after a failure)."""
    global _POOL
    world = len(per_rank_args)
    if _POOL is None or _POOL.backend != backend or _POOL.world != world \
            or not all(p.is_alive() for p in _POOL.processes):
        shutdown_wide_pool()
        _POOL = RankPool(backend, world, sizes=(world,))
    try:
        return _POOL.run(name, per_rank_args)
    except RankPoolError:
        shutdown_wide_pool()
        raise


def shutdown_wide_pool() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


atexit.register(shutdown_wide_pool)
