"""A second plugin whose probe blocks for 5 s (backend ``sleepy_b``): two slow probes must overlap, not add up."""
import time

from dsahal.registry import Backend, hookimpl


def probe():
    time.sleep(5.0)
    return True, "answered, too late"


@hookimpl
def dsahal_backends():
    return [Backend(name="sleepy_b", probe=probe, priority=1500, tags=frozenset({"test"}))]
