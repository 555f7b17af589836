"""Gloo ranks for the properties that need a wider group than :mod:`.distributed`'s (W = 2, 4).

The DCP merge at W >= 8 sends ``ceil(1.5k/W)`` candidates per rank, under k/5, so its resend path
(one rank owning more winners than it sent) only shows its sizing there. This pool reuses
:mod:`.distributed`'s rank worker and protocol; each of its ranks serves one group, all of them.
Its processes start on first use (seconds per rank: keep its users few) and stop with
:func:`shutdown_wide_pool` (the test module's fixture) or at exit.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp

from dsahal.conformance import distributed
from dsahal.conformance.distributed import STARTUP_TIMEOUT_S, TASK_TIMEOUT_S, RankPoolError

WIDE_WORLD = 8


def _wide_worker(rank: int, world: int, port: int, backend: str, inbox, outbox) -> None:
    distributed.WORLD_SIZES = (world,)  # in this rank process only: its one group is the whole pool
    distributed._worker(rank, world, port, backend, inbox, outbox)


class WideRankPool(distributed.RankPool):
    """``world`` gloo ranks serving groups of exactly ``world``."""

    def __init__(self, backend: str, world: int = WIDE_WORLD):  # noqa: super().__init__ would spawn 4 ranks
        ctx = mp.get_context("spawn")
        self.backend, self.world, self.task_id = backend, world, 0
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.outbox = ctx.Queue()
        port = distributed._free_port()
        self.processes = [ctx.Process(target=_wide_worker, args=(r, world, port, backend, self.inboxes[r],
                                                                  self.outbox), daemon=True) for r in range(world)]
        for p in self.processes:
            p.start()
        ready = self._collect("ready", world, STARTUP_TIMEOUT_S)
        failed = [payload for ok, payload, _ in ready.values() if not ok]
        if failed:
            self.close()
            raise RankPoolError(f"a gloo rank of the {world}-rank pool failed to start:\n{failed[0]}")

    def run(self, name: str, per_rank_args: list) -> list[tuple]:
        """Task ``name`` on every rank; ``[(result, (calls_before, calls_after)), ...]`` in rank order."""
        if len(per_rank_args) != self.world:
            raise ValueError(f"WideRankPool.run: expected arguments for {self.world} ranks, got {len(per_rank_args)}")
        self.task_id += 1
        for rank, args in enumerate(per_rank_args):
            self.inboxes[rank].put((self.task_id, name, self.world, args))
        answers = self._collect(self.task_id, self.world, TASK_TIMEOUT_S)
        errors = [f"rank {r}: {payload}" for r, (ok, payload, _) in sorted(answers.items()) if not ok]
        if errors:
            raise RankPoolError("; ".join(errors))
        return [(answers[r][1], answers[r][2]) for r in range(self.world)]


_POOL: WideRankPool | None = None


def run_on_wide_ranks(backend: str, name: str, per_rank_args: list) -> list[tuple]:
    """Like :func:`.distributed.run_on_ranks` on the wide pool (discarded after a failure)."""
    global _POOL
    if _POOL is None or _POOL.backend != backend or not all(p.is_alive() for p in _POOL.processes):
        shutdown_wide_pool()
        _POOL = WideRankPool(backend, len(per_rank_args))
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
