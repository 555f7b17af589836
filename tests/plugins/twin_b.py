"""The second of two plugins declaring one backend name, ``twin``."""
from dsahal.reference.topk import topk
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="twin", ops={"topk": topk}, priority=-1, description="twin from twin_b")]
