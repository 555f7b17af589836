"""Find backend plugins (entry points + ``DSAHAL_PLUGIN_MODULES``), register them with pluggy and
collect their backends. A plugin that fails is recorded, never fatal; one bad plugin never takes the
others down:

- a plugin that fails to import or register, registers nothing (no ``@hookimpl``) or declares op names
  that do not exist is listed in :attr:`Registry.failures` with the cause; its other backends stay;
- two plugins declaring one backend name keep one of them (:func:`_settle`) and the conflict is listed in
  :attr:`Registry.conflicts`, naming the backend and both plugins; ``DSAHAL_PLUGINS`` picks the other;
- probes run lazily, when a selection needs a backend's availability (the named backend's alone, or all
  for automatic selection and ``dsahal backends``), each in a daemon thread bounded by
  :data:`PROBE_TIMEOUT_S`: a probe that blocks makes its backend unavailable, saying so, and delays no
  process that selects another backend by name;
- a ``DSAHAL_PLUGINS`` entry naming no plugin is a warning listing the known plugin names.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import pluggy

from . import hookspecs
from .backend import Backend

log = logging.getLogger("dsahal")

REFERENCE_PLUGIN = "dsahal.reference.plugin"
_REGISTRY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Seconds a backend's probe may take before the backend is reported unavailable (the probe keeps running in
# its daemon thread; its late answer is ignored). Probes are meant to be cheap: a driver query, an import check.
PROBE_TIMEOUT_S = 2.0


class RegistryError(RuntimeError):
    """A configuration error of the backend registry (unknown or unavailable backend...)."""


@dataclass
class PluginFailure:
    plugin: str
    stage: str  # "import", "register" or "probe"
    error: str


@dataclass
class NameConflict:
    """Two plugins declared one backend name: ``kept``'s backend is registered, ``dropped``'s is not."""

    backend: str
    kept: str
    dropped: str
    why: str

    def describe(self) -> str:
        remedy = ("" if self.backend == "reference" else
                  f"; to use the other, list {self.dropped!r} and not {self.kept!r} in DSAHAL_PLUGINS")
        return (f"backend {self.backend!r} is declared by plugins {self.kept!r} and {self.dropped!r}: "
                f"the one of {self.kept!r} is used ({self.why}){remedy}")


class BackendRecord:
    """A discovered backend, its plugin and (probed on first use, bounded) availability and reason.

    ``available``/``reason`` given to the constructor skip the probe (tables built by hand in tests);
    left out, the first read of either runs :meth:`Backend.probe` in a daemon thread for at most
    :data:`PROBE_TIMEOUT_S` seconds. Thread-safe: concurrent readers wait for the same probe.
    """

    def __init__(self, backend: Backend, plugin: str, available: Optional[bool] = None, reason: str = "",
                 *, on_failure: Optional[Callable[[PluginFailure], None]] = None):
        self.backend = backend
        self.plugin = plugin
        self._available = None if available is None else bool(available)
        self._reason = str(reason)
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._started = 0.0
        self._answer: dict = {}

    def __repr__(self) -> str:
        state = "not probed" if self._available is None else ("available" if self._available else "unavailable")
        return f"BackendRecord({self.backend.name!r}, plugin={self.plugin!r}, {state}, {self._reason!r})"

    @property
    def probed(self) -> bool:
        return self._available is not None

    @property
    def available(self) -> bool:
        self.probe()
        return self._available

    @property
    def reason(self) -> str:
        self.probe()
        return self._reason

    def start_probe(self) -> None:
        """Start the probe without waiting for it (several backends then probe in parallel)."""
        if self._available is not None or self._thread is not None:
            return
        with self._lock:
            if self._available is not None or self._thread is not None:
                return
            answer = self._answer

            def run():
                try:
                    answer["result"] = self.backend.probe()
                except BaseException as exc:  # noqa: BLE001 - reported as the probe's failure, never fatal
                    answer["error"] = exc

            self._thread = threading.Thread(target=run, name=f"dsahal-probe-{self.backend.name}", daemon=True)
            self._started = time.monotonic()
            self._thread.start()

    def probe(self) -> None:
        """Probe once (bounded); later calls return at once."""
        if self._available is not None:
            return
        self.start_probe()
        with self._lock:
            if self._available is not None:
                return
            self._thread.join(max(0.0, self._started + PROBE_TIMEOUT_S - time.monotonic()))
            self._available, self._reason, failure = self._verdict()
        if failure is not None and self._on_failure is not None:
            self._on_failure(PluginFailure(self.plugin, "probe", failure))

    def _verdict(self) -> tuple[bool, str, Optional[str]]:
        """(available, reason, failure text or None) from what the probe thread left."""
        if "error" in self._answer:
            summary = _summarise(self._answer["error"])
            return False, f"probe raised {summary}", summary
        if "result" not in self._answer:
            failure = (f"probe of backend {self.backend.name!r} did not answer within {PROBE_TIMEOUT_S:g} s "
                       f"(dsahal.registry.discovery.PROBE_TIMEOUT_S)")
            return False, failure, failure
        result = self._answer["result"]
        if not (isinstance(result, tuple) and len(result) == 2):
            failure = f"probe of backend {self.backend.name!r} returned {result!r}, expected (ok, reason)"
            return False, failure, failure
        return bool(result[0]), str(result[1]), None


@dataclass
class Registry:
    records: dict[str, BackendRecord] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    conflicts: list[NameConflict] = field(default_factory=list)
    unknown_allowed: list[str] = field(default_factory=list)  # DSAHAL_PLUGINS entries naming no plugin
    known_plugins: list[str] = field(default_factory=list)

    def probe_all(self) -> None:
        """Probe every backend not probed yet, in parallel (so the whole takes at most about one timeout)."""
        for record in self.records.values():
            record.start_probe()
        for record in self.records.values():
            record.probe()

    def describe_all(self) -> str:
        """One line per backend, per failed plugin and per name conflict, for error messages."""
        self.probe_all()
        lines = [
            f"  {name}: {'available' if r.available else 'unavailable'} ({r.reason})"
            for name, r in sorted(self.records.items())
        ]
        lines += [f"  plugin {f.plugin}: failed at {f.stage}: {f.error}" for f in self.failures]
        lines += [f"  conflict: {c.describe()}" for c in self.conflicts]
        lines += [f"  plugin {p}: not loaded (not in DSAHAL_PLUGINS)" for p in self.excluded]
        lines += [f"  DSAHAL_PLUGINS: {unknown_entry_text(p, self.known_plugins)}" for p in self.unknown_allowed]
        return "\n".join(lines)


def unknown_entry_text(entry: str, known: list[str]) -> str:
    close = difflib.get_close_matches(entry, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"no plugin is named {entry!r} ({hint}known plugins: {', '.join(known)}); the entry is ignored"


def _summarise(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    # The plugin's line, not the registry's: a declaration dsahal refuses (Backend/Route validation) raises in
    # this package (through the __init__ dataclasses generate, "<string>"), which would point the vendor at
    # dsahal's source instead of the line to fix.
    outside = [f for f in frames if not f.filename.startswith(_REGISTRY_DIR) and f.filename != "<string>"]
    frames = outside or frames
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


@dataclass(frozen=True)
class _Candidate:
    name: str
    load: Callable[[], object]
    builtin: bool  # one of dsahal's own plugins: kept when a vendor plugin declares the same backend name


def _candidate_plugins(allow: set[str] | None) -> tuple[list[_Candidate], list[str], list[str]]:
    """Every plugin to load, the names the allow-list excluded, and every plugin name known here."""
    candidates: list[_Candidate] = []
    excluded: list[str] = []
    seen: set[str] = set()
    for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
        if ep.name in seen:
            continue  # the same distribution seen twice on sys.path (editable + site)
        seen.add(ep.name)
        if allow is not None and ep.name not in allow and ep.name != "reference":
            excluded.append(ep.name)
            continue
        candidates.append(_Candidate(ep.name, ep.load, ep.value.startswith("dsahal.")))
    modules = [m.strip() for m in os.environ.get("DSAHAL_PLUGIN_MODULES", "").split(",") if m.strip()]
    for module in modules:
        candidates.append(_Candidate(module, lambda m=module: importlib.import_module(m), False))
    if "reference" not in seen:
        # The reference is the oracle every fallback needs: load it even without package metadata.
        candidates.insert(0, _Candidate("reference", lambda: importlib.import_module(REFERENCE_PLUGIN), True))
    known = sorted(seen | {"reference"}) + [m for m in modules if m not in seen]
    return candidates, excluded, known


def _allow_list() -> set[str] | None:
    raw = os.environ.get("DSAHAL_PLUGINS")
    if raw is None or not raw.strip():
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _nothing_registered(plugin: object) -> str:
    unmarked = callable(getattr(plugin, "dsahal_backends", None))
    why = ("its dsahal_backends lacks the @dsahal.registry.hookimpl marker" if unmarked else
           "it has no @dsahal.registry.hookimpl function named dsahal_backends")
    return f"module loaded, nothing registered: {why}"


def _unknown_ops(backend: Backend) -> Optional[str]:
    from ..ops.catalog import OP_NAMES  # (the ops package imports the registry: import at call time)

    unknown = sorted(op for op in backend.ops if op not in OP_NAMES)
    if not unknown:
        return None
    hints = []
    for op in unknown:
        close = difflib.get_close_matches(op, OP_NAMES, n=1)
        hints.append(f"{op!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"backend {backend.name!r} declares unknown op name(s) {', '.join(hints)}: ignored, its other ops "
            f"are served; the ops are: {', '.join(OP_NAMES)}")


class _HookReturn(TypeError):
    """A plugin's dsahal_backends returned something other than a list of backends."""


def _collect(manager, candidate: _Candidate, registry: Registry) -> list[Backend]:
    """Load and register one plugin; its backends (none, with the cause recorded, when it fails)."""
    try:
        plugin = candidate.load()
    except KeyboardInterrupt:  # the user's (or a time limit's) interrupt is not the plugin's failure
        raise
    except BaseException as exc:  # noqa: BLE001 - a broken plugin (even one calling exit) must not break the others
        registry.failures.append(PluginFailure(candidate.name, "import", _summarise(exc)))
        return []
    try:
        manager.register(plugin, name=candidate.name)
        impls = [i for i in manager.hook.dsahal_backends.get_hookimpls() if i.plugin_name == candidate.name]
        if not impls:
            registry.failures.append(PluginFailure(candidate.name, "register", _nothing_registered(plugin)))
            return []
        backends = []
        for impl in impls:
            returned = impl.function() or []
            # `return backend` for `return [backend]` would fail below as "TypeError: 'Backend' object is not
            # iterable at discovery.py", naming neither the hook nor what it should return
            if isinstance(returned, (Backend, str, bytes)) or not hasattr(returned, "__iter__"):
                raise _HookReturn(f"its dsahal_backends returned {type(returned).__name__}, expected a list of "
                                  f"dsahal.Backend (return [backend])")
            backends.extend(returned)
    except KeyboardInterrupt:
        raise
    except _HookReturn as exc:
        registry.failures.append(PluginFailure(candidate.name, "register", str(exc)))
        return []
    except BaseException as exc:  # noqa: BLE001
        registry.failures.append(PluginFailure(candidate.name, "register", _summarise(exc)))
        return []
    if not backends:
        registry.failures.append(PluginFailure(candidate.name, "register",
                                               "module loaded, nothing registered: its dsahal_backends returned "
                                               "no backend"))
    kept = []
    for backend in backends:
        if not isinstance(backend, Backend):
            registry.failures.append(
                PluginFailure(candidate.name, "register", f"returned {type(backend).__name__}, not a dsahal.Backend"))
            continue
        unknown = _unknown_ops(backend)
        if unknown:
            registry.failures.append(PluginFailure(candidate.name, "register", unknown))
        kept.append(backend)
    return kept


def _settle(name: str, claims: list[tuple[_Candidate, Backend]], allow: set[str] | None):
    """The claim kept among several plugins' backends of one name, and why.

    The built-in reference always (it is every fallback's oracle); else the one claimant that
    ``DSAHAL_PLUGINS`` names; else a built-in plugin over a vendor's; else the first loaded.
    """
    if name == "reference":
        for claim in claims:
            if claim[0].builtin:
                return claim, "the built-in reference is every fallback's oracle and cannot be replaced"
    if allow is not None:
        listed = [c for c in claims if c[0].name in allow]
        if len(listed) == 1:
            return listed[0], f"DSAHAL_PLUGINS names {listed[0][0].name!r}"
    for claim in claims:
        if claim[0].builtin:
            return claim, "the built-in plugin is kept"
    return claims[0], "the first loaded is kept"


def discover() -> Registry:
    """Load every plugin and collect its backends (probed later, on first use: :class:`BackendRecord`).
    Never raises for a plugin's fault (KeyboardInterrupt aside): each is recorded in the registry."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    allow = _allow_list()
    candidates, excluded, known = _candidate_plugins(allow)
    registry = Registry(excluded=excluded, known_plugins=known)
    registry.unknown_allowed = sorted(p for p in (allow or ()) if p not in known)
    for entry in registry.unknown_allowed:
        log.warning("dsahal: DSAHAL_PLUGINS: %s", unknown_entry_text(entry, known))
    claims: dict[str, list[tuple[_Candidate, Backend]]] = {}
    for candidate in candidates:
        for backend in _collect(manager, candidate, registry):
            claims.setdefault(backend.name, []).append((candidate, backend))
    for name, claimed in claims.items():
        (kept, backend), why = _settle(name, claimed, allow)
        for candidate, _ in claimed:
            if candidate is not kept:
                conflict = NameConflict(name, kept.name, candidate.name, why)
                registry.conflicts.append(conflict)
                log.warning("dsahal: %s", conflict.describe())
        registry.records[name] = BackendRecord(backend, kept.name, on_failure=registry.failures.append)
    return registry
