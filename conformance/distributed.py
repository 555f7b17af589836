"""A pool of long-lived gloo ranks on 127.0.0.1 for the distributed properties.

Cases are drawn in the pytest process; each is sent to the ranks, which run the backend's
collective op on their shard and send back the result and their op-call counters (so reference
fallbacks inside a rank are still reported). Ranks start once per session (spawn, torch import:
seconds) and serve every example; groups of 2 and 4 ranks share the same processes.
A rank that fails or hangs poisons the collective, so the pool is then discarded and restarted.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import traceback
from datetime import timedelta

WORLD_SIZES = (2, 4)
STARTUP_TIMEOUT_S = 300.0
TASK_TIMEOUT_S = 90.0


class RankPoolError(RuntimeError):
    """A rank failed to start, raised, or did not answer in time."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _task_topk_merge(args, group):
    from dsahal import ops

    local_scores, local_lengths, k = args
    return ops.topk_merge(local_scores, local_lengths, k, group)


def _task_all_gather(args, group):
    from dsahal import ops

    (x,) = args
    return ops.all_gather(x, group)


def _task_all_to_all(args, group):
    from dsahal import ops

    x, output_split_sizes, input_split_sizes = args
    return ops.all_to_all(x, output_split_sizes, input_split_sizes, group)


TASKS = {"topk_merge": _task_topk_merge, "all_gather": _task_all_gather, "all_to_all": _task_all_to_all}


def _worker(rank: int, world: int, port: int, backend: str, inbox, outbox, sizes=WORLD_SIZES) -> None:
    try:
        import torch
        import torch.distributed as dist

        import dsahal
        from dsahal.registry.observers import CallLog, observe

        torch.set_num_threads(1)
        dsahal.set_backend(backend)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=TASK_TIMEOUT_S))
        groups = {w: dist.new_group(list(range(w))) for w in sizes if w <= world}
        outbox.put(("ready", rank, True, None, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test with it
        outbox.put(("ready", rank, False, traceback.format_exc(), None))
        return
    while True:
        message = inbox.get()
        if message is None:
            break
        task_id, name, size, args = message
        log = CallLog()
        try:
            with observe(log):
                result = TASKS[name](args, groups[size])
            outbox.put((task_id, rank, True, result, log.calls))
        except BaseException as exc:  # noqa: BLE001
            outbox.put((task_id, rank, False, f"{type(exc).__name__}: {exc}", log.calls))
    dist.destroy_process_group()


class RankPool:
    """``world`` gloo ranks serving groups of the sizes in ``sizes`` (ranks ``0..size-1``)."""

    def __init__(self, backend: str, world: int = max(WORLD_SIZES), sizes: tuple[int, ...] = WORLD_SIZES):
        ctx = mp.get_context("spawn")
        self.backend, self.world, self.task_id, self.sizes = backend, world, 0, tuple(sizes)
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.outbox = ctx.Queue()
        port = _free_port()
        self.processes = [ctx.Process(target=_worker, args=(r, world, port, backend, self.inboxes[r], self.outbox,
                                                            self.sizes), daemon=True) for r in range(world)]
        for p in self.processes:
            p.start()
        ready = self._collect("ready", world, STARTUP_TIMEOUT_S)
        failed = [payload for ok, payload, _ in ready.values() if not ok]
        if failed:
            self.close()
            raise RankPoolError(f"a gloo rank failed to start:\n{failed[0]}")

    def _collect(self, task_id, count: int, timeout: float) -> dict:
        answers = {}
        while len(answers) < count:
            try:
                tid, rank, ok, payload, counts = self.outbox.get(timeout=timeout)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.processes) if not p.is_alive()]
                raise RankPoolError(f"ranks did not answer within {timeout:.0f} s (dead ranks: {dead})") from None
            if tid == task_id:
                answers[rank] = (ok, payload, counts)
        return answers

    def run(self, name: str, per_rank_args: list) -> list[tuple]:
        """Run task ``name`` on ranks ``0..len(per_rank_args)-1`` (a group of that size).
        Returns ``[(result, calls), ...]`` in rank order, ``calls`` the op calls the rank made (observed)."""
        size = len(per_rank_args)
        if size not in self.sizes or size > self.world:
            raise ValueError(f"RankPool.run: group size {size} not in {self.sizes}")
        self.task_id += 1
        for rank, args in enumerate(per_rank_args):
            self.inboxes[rank].put((self.task_id, name, size, args))
        answers = self._collect(self.task_id, size, TASK_TIMEOUT_S)
        errors = [f"rank {r}: {payload}" for r, (ok, payload, _) in sorted(answers.items()) if not ok]
        if errors:
            raise RankPoolError("; ".join(errors))
        return [(answers[r][1], answers[r][2]) for r in range(size)]

    def close(self) -> None:
        for inbox in self.inboxes:
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
        for p in self.processes:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


_POOL: RankPool | None = None


def get_pool(backend: str) -> RankPool:
    global _POOL
    if _POOL is None or _POOL.backend != backend or not all(p.is_alive() for p in _POOL.processes):
        shutdown_pool()
        _POOL = RankPool(backend)
    return _POOL


def run_on_ranks(backend: str, name: str, per_rank_args: list) -> list[tuple]:
    """Like :meth:`RankPool.run`; a failed or hung pool is discarded so the next case starts clean."""
    pool = get_pool(backend)
    try:
        return pool.run(name, per_rank_args)
    except RankPoolError:
        shutdown_pool()
        raise


def shutdown_pool() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None
