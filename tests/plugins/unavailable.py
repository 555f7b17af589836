"""A plugin whose hardware is absent."""
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="ghost", probe=lambda: (False, "no ghost accelerator found"), priority=1000)]
