"""A plugin whose lse_combine route imports a module that calls ``sys.exit`` and whose topk route's probe
raises ``SystemExit``: each must turn its route off, never end the process."""
from dsahal.reference.topk import topk
from dsahal.registry import Backend, Route, hookimpl


def exiting_probe():
    raise SystemExit(3)


@hookimpl
def dsahal_backends():
    return [Backend(name="exiting", priority=-1, tags=frozenset({"test"}),
                    ops={"lse_combine": [Route("kernel", "plugins.audit_exits_on_import:lse_combine")],
                         "topk": [Route("probed", topk, probe=exiting_probe)]})]
