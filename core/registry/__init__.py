"""Backend registry: pluggy discovery at start-up, one resolved op table per process."""
from .backend import Backend, Capabilities, Route, always_available, package_versions, resolve_lazy
from .discovery import BackendRecord, PluginFailure, Registry, RegistryError, discover
from .hookspecs import ENTRY_POINT_GROUP, hookimpl, hookspec
from .observers import CallLog, OpCall, OpObserver, add_observer, observe, remove_observer
from .overrides import RouteOverrideError
from .state import active_table, registry, reset, set_backend, use_backend, use_routes
from .table import FallbackError, OpEntry, OpTable, select

__all__ = [
    "Backend", "Capabilities", "Route", "always_available", "package_versions", "resolve_lazy", "BackendRecord",
    "PluginFailure", "Registry", "RegistryError", "discover", "ENTRY_POINT_GROUP", "hookimpl", "hookspec",
    "CallLog", "OpCall", "OpObserver", "add_observer", "observe", "remove_observer", "RouteOverrideError",
    "active_table", "registry", "reset", "set_backend", "use_backend", "use_routes", "FallbackError", "OpEntry",
    "OpTable", "select",
]
