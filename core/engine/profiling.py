"""Per-op wall time of every ``dsahal.ops`` call: an observer of the op tables (:mod:`dsahal.registry`).

Every op call made through a table is announced to observers, so timing there sees every backend,
fused or composed, without touching the model. Composite ops (a backend's ``dsa_attention`` built
from its own ops) nest: each op's *self* time excludes the ops it called, so the self times add up
to the time spent in ops. On CUDA every call is bracketed by device synchronisations (which slows
the run a little but attributes time honestly). Each row also names the routes that served the op
and counts its fallbacks to the reference.

Calls made while a CUDA graph is being captured are neither synchronised (that would break the
capture) nor counted (nothing runs then); steps replayed from a graph run no Python at all, so
their ops never appear here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..registry.observers import OpCall, OpObserver, add_observer, remove_observer


@dataclass
class OpTime:
    calls: int = 0
    total_s: float = 0.0  # inclusive of nested ops
    self_s: float = 0.0  # exclusive
    fallback_calls: int = 0
    routes: dict = field(default_factory=dict)  # route name -> calls


class OpTimer(OpObserver):
    """Context manager: ``with OpTimer() as timer: ...``; then ``timer.times[op]``.

    Args:
        synchronize: synchronise CUDA around each call (default: when CUDA is initialised).
    """

    def __init__(self, synchronize: bool | None = None):
        self.synchronize = synchronize
        self.times: dict[str, OpTime] = {}
        self._stack: list[float] = []  # time spent in children of each open call
        self._sync = False
        self._cuda = torch.cuda.is_available()  # (a CPU-only build has no capture query at all)

    def __enter__(self) -> "OpTimer":
        self._sync = torch.cuda.is_available() and torch.cuda.is_initialized() if self.synchronize is None \
            else self.synchronize
        add_observer(self)
        return self

    def __exit__(self, *exc) -> None:
        remove_observer(self)

    def _capturing(self) -> bool:
        return self._cuda and torch.cuda.is_current_stream_capturing()

    def before(self, call: OpCall) -> None:
        if self._capturing():
            call.data["untimed"] = True
            return
        if self._sync:
            torch.cuda.synchronize()
        self._stack.append(0.0)
        call.data["start"] = time.perf_counter()

    def after(self, call: OpCall) -> None:
        if call.data.get("untimed"):
            return
        if self._sync and call.error is None:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - call.data["start"]
        children = self._stack.pop()
        if self._stack:
            self._stack[-1] += elapsed
        entry = self.times.setdefault(call.op, OpTime())
        entry.calls += 1
        entry.total_s += elapsed
        entry.self_s += elapsed - children
        entry.fallback_calls += call.fallback
        entry.routes[call.route] = entry.routes.get(call.route, 0) + 1

    @property
    def ops_seconds(self) -> float:
        return sum(t.self_s for t in self.times.values())

    def rows(self) -> list[dict]:
        """One dict per op, the most expensive (self time) first; ``routes`` names what served it."""
        return [
            {"op": op, "calls": t.calls, "total_ms": 1e3 * t.total_s, "self_ms": 1e3 * t.self_s,
             "status": "fallback" if t.fallback_calls == t.calls else "native",
             "routes": ", ".join(f"{name}" if n == t.calls else f"{name}×{n}" for name, n in t.routes.items()),
             "fallback_calls": t.fallback_calls}
            for op, t in sorted(self.times.items(), key=lambda kv: -kv[1].self_s)
        ]
