"""A plugin whose probe blocks for 5 s (a hung driver query); high priority, so automatic selection asks it."""
import time

from dsahal.registry import Backend, hookimpl

PROBED: list[float] = []


def probe():
    PROBED.append(time.monotonic())
    time.sleep(5.0)
    return True, "answered, too late"


@hookimpl
def dsahal_backends():
    return [Backend(name="sleepy", probe=probe, priority=2000, tags=frozenset({"test"}))]
