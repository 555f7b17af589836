"""Process-wide registry and active op table, created on first use; ``use_backend`` and
``use_routes`` override the table for the current thread (or asyncio task) only."""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading

from . import overrides, settings
from .discovery import Registry, discover
from .table import OpTable, select

_lock = threading.RLock()
_registry: Registry | None = None
_table: OpTable | None = None
# use_backend's override: a context variable, so a block run on another backend in one thread (a check
# against the reference, say) never redirects ops that other threads of a server run meanwhile.
_override: contextvars.ContextVar[OpTable | None] = contextvars.ContextVar("dsahal_backend_override", default=None)
# the tables of use_backend / use_routes blocks, resolved once per backend, overrides and the settings a table reads
# (building one resolves every op's routes: milliseconds; and a table logs each fallback reason once, so a block
# entered per call repeated its warning every time); forgotten by reset()
_block_tables: dict[tuple, OpTable] = {}


def registry() -> Registry:
    """The process's registry, discovered on first use, after the environment's settings are checked
    (:func:`settings.check_environment`: a mistyped flag or ``DSAHAL_ROUTES`` raises here, once)."""
    global _registry
    with _lock:
        if _registry is None:
            settings.check_environment()
            _registry = discover()
        return _registry


def _resolve(name: str | None, route_overrides: overrides.RouteOverrides | None = None, *,
             selected: bool = True, source: str = overrides.ENV) -> OpTable:
    """``selected``: this is the process's backend, so ``DSAHAL_ROUTES`` must name its routes; a table for a
    ``use_backend`` block keeps only the items that name routes of its backend."""
    from ..ops.catalog import COMPOSITE_OPS, OP_NAMES

    reg = registry()
    if not (name or os.environ.get("DSAHAL_BACKEND")):
        reg.probe_all()  # automatic selection reads every backend's probe: run them in parallel, each bounded
    return OpTable(select(reg, name), reg.records["reference"], OP_NAMES, COMPOSITE_OPS,
                   route_overrides=route_overrides, overrides_apply_to_all=selected, overrides_source=source)


def _block_table(name: str, route_overrides: overrides.RouteOverrides | None = None, *,
                 selected: bool = True, source: str = overrides.ENV) -> OpTable:
    """:func:`_resolve` for a ``use_backend`` / ``use_routes`` block, kept per backend, overrides and the
    environment's ``DSAHAL_ROUTES`` / ``DSAHAL_STRICT`` (which a table reads when it is built)."""
    key = (name, None if route_overrides is None else route_overrides.text(), selected, source,
           os.environ.get(overrides.ENV), os.environ.get(settings.STRICT))
    table = _block_tables.get(key)
    if table is None:
        table = _block_tables[key] = _resolve(name, route_overrides, selected=selected, source=source)
    return table


def active_table() -> OpTable:
    """The table of this thread's ``use_backend`` block if inside one, else of the process's backend
    (``set_backend``, ``DSAHAL_BACKEND`` or automatic), resolved once."""
    global _table
    override = _override.get()
    if override is not None:
        return override
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
    """Run a block on another backend in this thread (or asyncio task); other threads keep theirs.
    Blocks nest; the previous selection is restored on exit."""
    with _lock:
        table = _block_table(name, selected=False)
    token = _override.set(table)
    try:
        yield table
    finally:
        _override.reset(token)


@contextlib.contextmanager
def use_routes(spec=None, **by_op: str):
    """Force or disable routes in a block (this thread or asyncio task), on the current backend.

    ``spec`` takes ``DSAHAL_ROUTES``'s text (``"sparse_mla:triton,topk:-aiter"``) or a mapping; keyword
    arguments add ``op="route"`` items. They apply on top of ``DSAHAL_ROUTES``. An unknown op or route
    is a :class:`RegistryError` listing what exists::

        with dsahal.use_routes(sparse_mla="triton"):
            o, lse = dsahal.ops.sparse_mla(...)
    """
    current = active_table()  # its overrides already hold DSAHAL_ROUTES' items for its backend
    wanted = overrides.parse(spec, source="use_routes")
    if by_op:
        wanted = wanted.merged(overrides.parse(by_op, source="use_routes"))
    with _lock:
        # (its messages name use_routes, whose items sit on top of those already in effect)
        table = _block_table(current.name, current.overrides.merged(wanted), source="use_routes")
    token = _override.set(table)
    try:
        yield table
    finally:
        _override.reset(token)


def reset() -> None:
    """Forget the registry and table so the next use re-reads the environment (tests)."""
    global _registry, _table
    with _lock:
        _registry, _table = None, None
        _block_tables.clear()
    _override.set(None)
