"""A backend whose lse_combine is interrupted mid-property (as a time limit or Ctrl-C would):
the interrupted test must be reported "incomplete", never "pass"."""
from dsahal.registry import Backend, hookimpl


def lse_combine(o_parts, lse_parts):
    raise KeyboardInterrupt


@hookimpl
def dsahal_backends():
    return [Backend(name="interruptlse", ops={"lse_combine": lse_combine}, tags=frozenset({"test"}), priority=-10)]
