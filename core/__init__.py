"""dsahal: one op interface for the attention of hybrid sparse-attention LLMs, many backends.

    import dsahal
    o, lse = dsahal.ops.sparse_mla(q, kv_pages, slots, kv_fmt="fp8_ds_mla", softmax_scale=s)

The backend is chosen by ``DSAHAL_BACKEND`` (or automatically) when the first op runs.
"""
from . import formats, ops
from ._version import __version__
from .registry import (
    Backend,
    Capabilities,
    CallLog,
    FallbackError,
    OpCall,
    OpObserver,
    RegistryError,
    Route,
    active_table,
    add_observer,
    hookimpl,
    observe,
    remove_observer,
    set_backend,
    use_backend,
    use_routes,
)

__all__ = [
    "__version__", "ops", "formats", "Backend", "Capabilities", "Route", "FallbackError", "RegistryError",
    "active_table", "hookimpl", "set_backend", "use_backend", "use_routes", "observe", "add_observer",
    "remove_observer", "OpObserver", "OpCall", "CallLog",
]
