"""A backend whose lse_combine kills its own process (SIGKILL, as the kernel's OOM killer would):
``dsahal conformance --jobs N`` must report the child that ran it as crashed, naming its ops."""
import os
import signal

from dsahal.registry import Backend, hookimpl


def lse_combine(o_parts, lse_parts):
    os.kill(os.getpid(), signal.SIGKILL)


@hookimpl
def dsahal_backends():
    return [Backend(name="crashlse", ops={"lse_combine": lse_combine}, tags=frozenset({"test"}), priority=-10)]
