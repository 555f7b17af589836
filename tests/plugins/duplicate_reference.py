"""A plugin that claims a name another plugin already owns."""
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return [Backend(name="reference")]
