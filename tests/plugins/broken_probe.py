"""A plugin whose probe raises."""
from dsahal.registry import Backend, hookimpl


def probe():
    raise RuntimeError("driver query failed")


@hookimpl
def dsahal_backends():
    return [Backend(name="badprobe", probe=probe)]
