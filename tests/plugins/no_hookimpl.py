"""A plugin that forgets ``@hookimpl``: the module loads and registers nothing."""
from dsahal.registry import Backend


def dsahal_backends():
    return [Backend(name="forgotten")]
