"""A plugin whose every op is a ``"module:attr"`` that does not exist: a missing attribute, a missing module."""
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="brokenpath", priority=-1, tags=frozenset({"test"}),
                    ops={"lse_combine": "plugins.missing_paths:lse_combine_kernel",
                         "topk": "no_such_vendor_module_xyz:topk"})]
