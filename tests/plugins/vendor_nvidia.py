"""A vendor package that declares the built-in backend name ``nvidia`` (and works)."""
from dsahal.reference.lse_combine import lse_combine
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="nvidia", ops={"lse_combine": lse_combine}, priority=-1, tags=frozenset({"test"}),
                    description="a vendor's nvidia")]
