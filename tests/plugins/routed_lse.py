"""A plugin declaring two routes for lse_combine, in the documented way (a list of dsahal.Route)."""
from dsahal.reference.lse_combine import lse_combine as reference_lse_combine
from dsahal.registry import Backend, Route, hookimpl

SERVED: list[str] = []


def fast(o_parts, lse_parts):
    SERVED.append("fast")
    return reference_lse_combine(o_parts, lse_parts)


def general(o_parts, lse_parts):
    SERVED.append("general")
    return reference_lse_combine(o_parts, lse_parts)


def finite_scale_only(o_parts, lse_parts):
    return (True, "") if o_parts.dtype.is_floating_point else (False, "needs float partial outputs")


@hookimpl
def dsahal_backends():
    return [Backend(name="routed", ops={"lse_combine": [Route("fast", fast, finite_scale_only), Route("general", general)]},
                    tags=frozenset({"test"}), priority=-5)]
