"""The first of two plugins declaring one backend name, ``twin``."""
from dsahal.reference.lse_combine import lse_combine
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="twin", ops={"lse_combine": lse_combine}, priority=-1, description="twin from twin_a")]
