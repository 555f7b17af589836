"""An available high-priority plugin (for automatic selection)."""
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="eager", priority=500, tags=frozenset({"test"}))]
