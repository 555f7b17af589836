"""Find backend plugins (entry points + ``DSAHAL_PLUGIN_MODULES``), register them with pluggy,
collect their backends and probe each one. A plugin that fails is recorded, never fatal."""
from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import traceback
from dataclasses import dataclass, field

import pluggy

from . import hookspecs
from .backend import Backend

REFERENCE_PLUGIN = "dsahal.reference.plugin"


class RegistryError(RuntimeError):
    """A configuration error of the backend registry (duplicate names, unknown backend...)."""


@dataclass
class BackendRecord:
    backend: Backend
    plugin: str
    available: bool
    reason: str


@dataclass
class PluginFailure:
    plugin: str
    stage: str  # "import", "register" or "probe"
    error: str


@dataclass
class Registry:
    records: dict[str, BackendRecord] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def describe_all(self) -> str:
        """One line per backend and per failed plugin, for error messages."""
        lines = [
            f"  {name}: {'available' if r.available else 'unavailable'} ({r.reason})"
            for name, r in sorted(self.records.items())
        ]
        lines += [f"  plugin {f.plugin}: failed at {f.stage}: {f.error}" for f in self.failures]
        lines += [f"  plugin {p}: not loaded (not in DSAHAL_PLUGINS)" for p in self.excluded]
        return "\n".join(lines)


def _summarise(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _candidate_plugins(allow: set[str] | None) -> tuple[list[tuple[str, object]], list[str]]:
    """(name, loader) for every plugin to load, and the names the allow-list excluded."""
    candidates: list[tuple[str, object]] = []
    excluded: list[str] = []
    seen: set[str] = set()
    for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
        if ep.name in seen:
            continue  # the same distribution seen twice on sys.path (editable + site)
        seen.add(ep.name)
        if allow is not None and ep.name not in allow and ep.name != "reference":
            excluded.append(ep.name)
            continue
        candidates.append((ep.name, ep.load))
    for module in filter(None, os.environ.get("DSAHAL_PLUGIN_MODULES", "").split(",")):
        module = module.strip()
        candidates.append((module, lambda m=module: importlib.import_module(m)))
    if "reference" not in seen:
        # The reference is the oracle every fallback needs: load it even without package metadata.
        candidates.insert(0, ("reference", lambda: importlib.import_module(REFERENCE_PLUGIN)))
    return candidates, excluded


def _allow_list() -> set[str] | None:
    raw = os.environ.get("DSAHAL_PLUGINS")
    if raw is None or not raw.strip():
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def discover() -> Registry:
    """Load every plugin, collect and probe its backends. Raises :class:`RegistryError` when two
    plugins claim the same backend name (exclude one with ``DSAHAL_PLUGINS``)."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    candidates, excluded = _candidate_plugins(_allow_list())
    registry = Registry(excluded=excluded)
    owners: dict[str, str] = {}
    for plugin_name, load in candidates:
        try:
            plugin = load()
        except KeyboardInterrupt:  # the user's (or a time limit's) interrupt is not the plugin's failure
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken plugin (even one calling exit) must not break the others
            registry.failures.append(PluginFailure(plugin_name, "import", _summarise(exc)))
            continue
        try:
            manager.register(plugin, name=plugin_name)
            impls = [i for i in manager.hook.dsahal_backends.get_hookimpls() if i.plugin_name == plugin_name]
            backends = [b for impl in impls for b in (impl.function() or [])]
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            registry.failures.append(PluginFailure(plugin_name, "register", _summarise(exc)))
            continue
        for backend in backends:
            if not isinstance(backend, Backend):
                registry.failures.append(
                    PluginFailure(plugin_name, "register", f"returned {type(backend).__name__}, not a dsahal.Backend")
                )
                continue
            if backend.name in owners:
                raise RegistryError(
                    f"backend name {backend.name!r} is claimed by two plugins: {owners[backend.name]!r} and "
                    f"{plugin_name!r}; uninstall one or exclude it with DSAHAL_PLUGINS"
                )
            owners[backend.name] = plugin_name
            registry.records[backend.name] = _probe(backend, plugin_name, registry)
    return registry


def _probe(backend: Backend, plugin_name: str, registry: Registry) -> BackendRecord:
    try:
        ok, reason = backend.probe()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        registry.failures.append(PluginFailure(plugin_name, "probe", _summarise(exc)))
        return BackendRecord(backend, plugin_name, False, f"probe raised {_summarise(exc)}")
    return BackendRecord(backend, plugin_name, bool(ok), str(reason))
