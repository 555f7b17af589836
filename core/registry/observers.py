"""Observing op calls: the one documented way to see what the op tables do.

An observer is any object with ``before(call)`` and ``after(call)`` methods (:class:`OpObserver`
gives empty defaults). While at least one is registered, every op call made through a table —
``dsahal.ops.X``, ``torch.ops.dsahal.X`` and the nested calls of composite ops — is announced with an
:class:`OpCall` naming the op, the backend, the route that serves it and, for a fallback, why every
route declined. With none registered, a call pays one truthiness check of a list. README
("Observers") and docs/backend-guide.md §4-5 show them in use.

Observers run in registration order in ``before`` and in reverse order in ``after``, on the thread
making the call; ``after`` runs also when the op raises (``call.error`` holds the exception). An
exception raised by an observer propagates: observers are tools of the caller, not of a backend.
Observers are process-wide; the profiler of ``dsahal run``, the CUDA-graph capture check and the
conformance report are all observers.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

# Read on every call by the tables (a module global, mutated in place, never rebound).
OBSERVERS: list = []
_lock = threading.Lock()


@dataclass
class OpCall:
    """One op call as an observer sees it.

    Attributes:
        op: the op's name.
        backend: the backend whose table served the call.
        route: the route that served it (``"reference"`` for a fallback).
        fallback: served by the reference because no route of the backend took it.
        reason: for a fallback, why (every route's refusal, ``; ``-joined); else ``""``.
        declined: ``(route, reason)`` for each route that declined before the one that served.
        args: the op's arguments, in the order of its spec.
        error: the exception the op raised, if it did (set before ``after``).
        data: a scratch dict for observers (e.g. a start time), shared by ``before`` and ``after``.
    """

    op: str
    backend: str
    route: str
    fallback: bool
    reason: str
    declined: tuple[tuple[str, str], ...]
    args: tuple
    error: Optional[BaseException] = None
    data: dict[str, Any] = field(default_factory=dict)


class OpObserver:
    """Base class with do-nothing hooks; override either."""

    def before(self, call: OpCall) -> None:
        """Called just before the implementation runs."""

    def after(self, call: OpCall) -> None:
        """Called just after it returned or raised."""


def add_observer(observer) -> None:
    """Register ``observer`` process-wide (idempotent)."""
    if not (callable(getattr(observer, "before", None)) and callable(getattr(observer, "after", None))):
        raise TypeError(f"dsahal.add_observer: argument 'observer' expected an object with before(call) and "
                        f"after(call) methods, got {type(observer).__name__}")
    with _lock:
        if not any(o is observer for o in OBSERVERS):
            OBSERVERS.append(observer)


def remove_observer(observer) -> None:
    """Unregister ``observer`` (no error if it was not registered)."""
    with _lock:
        for i, registered in enumerate(OBSERVERS):
            if registered is observer:
                del OBSERVERS[i]
                return


@contextlib.contextmanager
def observe(observer):
    """``with observe(obs) as obs:`` registers ``obs`` for the block."""
    add_observer(observer)
    try:
        yield observer
    finally:
        remove_observer(observer)


@dataclass(frozen=True)
class CallRecord:
    """What :class:`CallLog` keeps of a call (no arguments: a log must not keep tensors alive)."""

    op: str
    backend: str
    route: str
    fallback: bool
    reason: str


class CallLog(OpObserver):
    """Records every call: ``log.calls`` (in order); helpers count by op, route and fallback."""

    def __init__(self):
        self.calls: list[CallRecord] = []

    def after(self, call: OpCall) -> None:
        self.calls.append(CallRecord(call.op, call.backend, call.route, call.fallback, call.reason))

    def count(self, op: Optional[str] = None, *, fallback: Optional[bool] = None) -> int:
        return sum(1 for c in self.calls if (op is None or c.op == op) and (fallback is None or c.fallback == fallback))

    def routes(self, op: Optional[str] = None) -> dict[str, int]:
        """``{"op:route": calls}``."""
        counts: dict[str, int] = {}
        for c in self.calls:
            if op is None or c.op == op:
                key = f"{c.op}:{c.route}"
                counts[key] = counts.get(key, 0) + 1
        return counts

    def fallback_ops(self) -> set[str]:
        return {c.op for c in self.calls if c.fallback}
