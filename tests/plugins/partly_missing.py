"""A plugin with one working op and one ``"module:attr"`` whose attribute does not exist."""
from dsahal.reference.lse_combine import lse_combine
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="partly", priority=-1, tags=frozenset({"test"}),
                    ops={"lse_combine": lse_combine, "topk": "plugins.partly_missing:topk_kernel"})]
