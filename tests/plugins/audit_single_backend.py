"""A plugin whose hook returns one Backend instead of a list of them."""
from dsahal.registry import Backend, hookimpl


@hookimpl
def dsahal_backends():
    return Backend(name="single", priority=-1)
