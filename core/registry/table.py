"""The op -> implementation table, resolved once per process for the selected backend.

Each call goes ``table.call(op, ...)``: one dict lookup, the op's verifier if the backend
declared one, then the function. No pluggy call happens here.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from .backend import resolve_lazy
from .discovery import BackendRecord, Registry, RegistryError

log = logging.getLogger("dsahal")


class FallbackError(RuntimeError):
    """Raised instead of falling back to the reference when ``DSAHAL_STRICT=1``."""


@dataclass(frozen=True)
class OpEntry:
    op: str
    fn: Callable[..., Any]
    verifier: Callable[..., tuple[bool, str]] | None
    backend: str
    status: str  # "native", "fallback" or "composite" (built from the backend's own ops)
    reason: str


def select(registry: Registry, name: str | None = None) -> BackendRecord:
    """The backend named (or in ``DSAHAL_BACKEND``), else the highest-priority available one."""
    name = name or os.environ.get("DSAHAL_BACKEND") or None
    if name is not None:
        record = registry.records.get(name)
        if record is None:
            raise RegistryError(f"unknown backend {name!r}; the backends that exist are:\n{registry.describe_all()}")
        if not record.available:
            raise RegistryError(
                f"backend {name!r} is not available here: {record.reason}\nall backends:\n{registry.describe_all()}"
            )
        return record
    available = [r for r in registry.records.values() if r.available]
    if not available:
        raise RegistryError(f"no backend is available:\n{registry.describe_all()}")
    return max(available, key=lambda r: (r.backend.priority, r.backend.name == "reference", r.backend.name))


class OpTable:
    """The resolved dispatch table of one backend, with the reference behind every op."""

    def __init__(self, record: BackendRecord, reference: BackendRecord, op_names, composite_ops, strict=None):
        self.record = record
        self.strict = os.environ.get("DSAHAL_STRICT", "0") not in ("", "0") if strict is None else strict
        self.reference = {op: resolve_lazy(reference.backend.ops[op]) for op in op_names}
        self.entries: dict[str, OpEntry] = {}
        self.calls: dict[str, list[int]] = {op: [0, 0] for op in op_names}  # [native, fallback]
        self._logged: set[tuple[str, str, str]] = set()
        backend = record.backend
        for op in op_names:
            if op in backend.ops:
                verifier = backend.verifiers.get(op)
                self.entries[op] = OpEntry(
                    op, resolve_lazy(backend.ops[op]), resolve_lazy(verifier) if verifier else None,
                    backend.name, "native", "",
                )
            elif op in composite_ops:
                self.entries[op] = OpEntry(op, self.reference[op], None, backend.name, "composite",
                                           "composed from the backend's own ops")
            else:
                self.entries[op] = OpEntry(op, self.reference[op], None, "reference", "fallback",
                                           f"backend {backend.name!r} does not implement {op}")

    @property
    def name(self) -> str:
        return self.record.backend.name

    def call(self, op: str, *args, **kwargs):
        entry = self.entries[op]
        if entry.status == "fallback":
            return self._fall_back(op, entry.reason, args, kwargs)
        if entry.verifier is not None:
            ok, reason = entry.verifier(*args, **kwargs)
            if not ok:
                return self._fall_back(op, f"{entry.backend} verifier: {reason}", args, kwargs)
        self.calls[op][0] += 1
        return entry.fn(*args, **kwargs)

    def _fall_back(self, op: str, reason: str, args, kwargs):
        if self.strict and self.name != "reference":
            raise FallbackError(f"dsahal.{op}: backend {self.name!r} would fall back to the reference "
                                f"({reason}) and DSAHAL_STRICT=1 forbids it")
        key = (op, self.name, reason)
        if key not in self._logged:
            self._logged.add(key)
            log.warning("dsahal.%s: falling back to the reference on backend %r: %s", op, self.name, reason)
        self.calls[op][1] += 1
        return self.reference[op](*args, **kwargs)

    def would_fall_back(self, op: str, *args, **kwargs) -> tuple[bool, str]:
        """Whether a call with these arguments would be served by the reference, and why."""
        entry = self.entries[op]
        if entry.status == "fallback":
            return True, entry.reason
        if entry.verifier is not None:
            ok, reason = entry.verifier(*args, **kwargs)
            if not ok:
                return True, reason
        return False, ""
