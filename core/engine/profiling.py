"""Per-op wall time of every ``dsahal.ops`` dispatch, by wrapping the active op table's ``call``.

Every op reaches its implementation through ``active_table().call(op, ...)``, so timing that one
method sees every backend, fused or composed, without touching the model. Composite ops (a
backend's ``dsa_attention`` built from its own ops) nest: each op's *self* time excludes the ops
it called, so the self times add up to the time spent in ops. On CUDA every call is bracketed
by device synchronisations (which slows the run a little but attributes time honestly).

Calls made while a CUDA graph is being captured are neither synchronised (that would break the
capture) nor counted (nothing runs then); steps replayed from a graph run no Python at all, so
their ops never appear here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..registry.state import active_table


@dataclass
class OpTime:
    calls: int = 0
    total_s: float = 0.0  # inclusive of nested ops
    self_s: float = 0.0  # exclusive


@dataclass
class OpTimer:
    """Context manager: ``with OpTimer() as timer: ...``; then ``timer.times[op]``.

    Args:
        synchronize: synchronise CUDA around each call (default: when CUDA is initialised).
    """

    synchronize: bool | None = None
    times: dict[str, OpTime] = field(default_factory=dict)

    def __enter__(self) -> "OpTimer":
        self._table = active_table()
        self._original = self._table.call
        sync = torch.cuda.is_available() and torch.cuda.is_initialized() if self.synchronize is None \
            else self.synchronize
        stack: list[float] = []  # time spent in children of each open call
        cuda = torch.cuda.is_available()  # (a CPU-only build has no capture query at all)

        def timed_call(op, *args, **kwargs):
            if cuda and torch.cuda.is_current_stream_capturing():
                return self._original(op, *args, **kwargs)
            if sync:
                torch.cuda.synchronize()
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return self._original(op, *args, **kwargs)
            finally:
                if sync:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                children = stack.pop()
                if stack:
                    stack[-1] += elapsed
                entry = self.times.setdefault(op, OpTime())
                entry.calls += 1
                entry.total_s += elapsed
                entry.self_s += elapsed - children

        self._table.call = timed_call  # instance attribute shadows the method for this table only
        return self

    def __exit__(self, *exc) -> None:
        del self._table.call

    @property
    def ops_seconds(self) -> float:
        return sum(t.self_s for t in self.times.values())

    def rows(self) -> list[dict]:
        """One dict per op, the most expensive (self time) first."""
        table = self._table
        return [
            {"op": op, "calls": t.calls, "total_ms": 1e3 * t.total_s, "self_ms": 1e3 * t.self_s,
             "status": table.entries[op].status if op in table.entries else "?",
             "fallback_calls": table.calls.get(op, [0, 0])[1]}
            for op, t in sorted(self.times.items(), key=lambda kv: -kv[1].self_s)
        ]
