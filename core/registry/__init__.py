"""Backend registry: pluggy discovery at start-up, one resolved op table per process."""
from .backend import Backend, Capabilities, always_available, package_versions, resolve_lazy
from .discovery import BackendRecord, PluginFailure, Registry, RegistryError, discover
from .hookspecs import ENTRY_POINT_GROUP, hookimpl, hookspec
from .state import active_table, registry, reset, set_backend, use_backend
from .table import FallbackError, OpEntry, OpTable, select

__all__ = [
    "Backend", "Capabilities", "always_available", "package_versions", "resolve_lazy", "BackendRecord", "PluginFailure",
    "Registry", "RegistryError", "discover", "ENTRY_POINT_GROUP", "hookimpl", "hookspec", "active_table",
    "registry", "reset", "set_backend", "use_backend", "FallbackError", "OpEntry", "OpTable", "select",
]
