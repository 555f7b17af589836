"""Forcing and disabling routes, for debugging and benchmarking.

``DSAHAL_ROUTES`` (read when an op table is resolved) and :func:`dsahal.use_routes` take the same
text: comma-separated items, each ``op:route`` (only this route serves the op; the reference still
catches calls it declines, unless ``DSAHAL_STRICT=1``), ``op:-route`` (never this route) or
``op:reference`` (the reference serves every call of the op). An op may carry several ``-route``
items; a forced route and a disabled one for the same op contradict each other and are an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

from .discovery import RegistryError

ENV = "DSAHAL_ROUTES"
REFERENCE = "reference"


class RouteOverrideError(RegistryError, ValueError):
    """A malformed ``DSAHAL_ROUTES`` / ``use_routes`` text, or an unknown op or route in it."""


@dataclass(frozen=True)
class RouteOverrides:
    """``forced[op] = route`` and ``disabled[op] = {routes}``."""

    forced: Mapping[str, str] = field(default_factory=dict)
    disabled: Mapping[str, frozenset] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.forced or self.disabled)

    def merged(self, other: "RouteOverrides") -> "RouteOverrides":
        """``other`` on top of ``self``: its forced routes replace ours; disabled sets add up."""
        forced = {**self.forced, **other.forced}
        disabled = {op: frozenset(self.disabled.get(op, ())) | frozenset(other.disabled.get(op, ()))
                    for op in set(self.disabled) | set(other.disabled)}
        for op in other.forced:
            disabled.pop(op, None)
        return RouteOverrides(forced, disabled)

    def text(self) -> str:
        items = [f"{op}:{route}" for op, route in sorted(self.forced.items())]
        items += [f"{op}:-{route}" for op, routes in sorted(self.disabled.items()) for route in sorted(routes)]
        return ",".join(items)


def parse(spec: Union[str, Mapping[str, str], None], *, source: str = ENV) -> RouteOverrides:
    """Parse ``"sparse_mla:triton,topk:-aiter"`` (or ``{"sparse_mla": "triton"}``)."""
    if spec is None:
        return RouteOverrides()
    items = [f"{op}:{route}" for op, route in spec.items()] if isinstance(spec, Mapping) else \
        [item.strip() for item in str(spec).split(",") if item.strip()]
    forced: dict[str, str] = {}
    disabled: dict[str, set] = {}
    for item in items:
        op, sep, route = (part.strip() for part in item.partition(":"))
        if not sep or not op or not route or route == "-":
            raise RouteOverrideError(f"{source}: item {item!r} expected 'op:route' or 'op:-route'")
        if route.startswith("-"):
            if route[1:] == REFERENCE:
                raise RouteOverrideError(f"{source}: item {item!r}: the reference cannot be disabled (it is the "
                                         f"fallback of every op); force a route instead")
            disabled.setdefault(op, set()).add(route[1:])
        elif op in forced and forced[op] != route:
            raise RouteOverrideError(f"{source}: op {op!r} forced to two routes: {forced[op]!r} and {route!r}")
        else:
            forced[op] = route
    clash = sorted(op for op in forced if op in disabled)
    if clash:
        raise RouteOverrideError(f"{source}: op(s) {clash} both forced and disabled")
    return RouteOverrides(forced, {op: frozenset(r) for op, r in disabled.items()})
