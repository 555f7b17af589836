"""Process-wide registry and active op table, created on first use."""
from __future__ import annotations

import contextlib
import threading

from .discovery import Registry, discover
from .table import OpTable, select

_lock = threading.RLock()
_registry: Registry | None = None
_table: OpTable | None = None


def registry() -> Registry:
    global _registry
    with _lock:
        if _registry is None:
            _registry = discover()
        return _registry


def _resolve(name: str | None) -> OpTable:
    from ..ops.catalog import COMPOSITE_OPS, OP_NAMES

    reg = registry()
    return OpTable(select(reg, name), reg.records["reference"], OP_NAMES, COMPOSITE_OPS)


def active_table() -> OpTable:
    """The table of the selected backend (``DSAHAL_BACKEND`` or automatic), resolved once."""
    global _table
    table = _table
    if table is None:
        with _lock:
            if _table is None:
                _table = _resolve(None)
            table = _table
    return table


def set_backend(name: str | None) -> OpTable:
    """Select a backend for the rest of the process (``None``: environment / automatic)."""
    global _table
    with _lock:
        _table = _resolve(name)
        return _table


@contextlib.contextmanager
def use_backend(name: str):
    """Run a block on another backend, then restore the previous table (not thread-local)."""
    global _table
    with _lock:
        previous = _table
        _table = _resolve(name)
    try:
        yield _table
    finally:
        with _lock:
            _table = previous


def reset() -> None:
    """Forget the registry and table so the next use re-reads the environment (tests)."""
    global _registry, _table
    with _lock:
        _registry, _table = None, None
