"""A plugin whose route probe blocks for 5 s (a hung driver query) in front of a route without a probe."""
import time

from dsahal.reference.lse_combine import lse_combine
from dsahal.registry import Backend, Route, hookimpl


def hung_probe():
    time.sleep(5.0)
    return True, "answered, too late"


@hookimpl
def dsahal_backends():
    return [Backend(name="hungroute", priority=-1, tags=frozenset({"test"}),
                    ops={"lse_combine": [Route("vendor", lse_combine, probe=hung_probe), Route("torch", lse_combine)]})]
