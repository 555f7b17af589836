"""The op table: each op's ordered routes, resolved once per process for the selected backend.

Resolution (once) imports each route's implementation and verifier, runs its probe, checks its
signature against the op's spec and applies ``DSAHAL_ROUTES``. A call then runs ``dispatch[op]``: the
first route whose verifier accepts the arguments serves it; the reference serves only when every
route declines (logged once per reason; an error under ``DSAHAL_STRICT=1``). Composite ops (a DSA
layer) end their list with the composition of the backend's own ops, so they never fall back whole.
No pluggy call, environment read or allocation happens per call; with no observer registered
(:mod:`.observers`) a call costs the verifiers it runs and two Python calls.
"""
from __future__ import annotations

import contextvars
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import observers, overrides, settings
from .backend import Route
from .discovery import BackendRecord, Registry, RegistryError
from .backend import resolve_lazy
from .signature import SignatureMismatch, adapt_to_spec

log = logging.getLogger("dsahal")

COMPOSITE_ROUTE = "composite"
COMPOSITE_IMPLEMENTATIONS = {"dsa_attention": "dsahal.ops.composite:dsa_attention"}


class FallbackError(RuntimeError):
    """Raised instead of falling back to the reference when ``DSAHAL_STRICT=1``."""


@dataclass(frozen=True)
class ResolvedRoute:
    """A declared route after resolution: usable (``available``) or not, and why."""

    name: str
    fn: Optional[Callable[..., Any]]
    verifier: Optional[Callable[..., tuple[bool, str]]]
    available: bool
    reason: str  # why not available; for an available route its description (or "")


@dataclass(frozen=True)
class OpEntry:
    """One op of a table: every declared route (usable or not) and the ones calls try, in order.

    ``status`` is ``"native"`` (a route of the backend serves it), ``"composite"`` (the composition
    of the backend's own ops) or ``"fallback"`` (no usable route: the reference serves every call).
    """

    op: str
    backend: str
    status: str
    reason: str
    routes: tuple[ResolvedRoute, ...]
    active: tuple[ResolvedRoute, ...]

    @property
    def fn(self) -> Optional[Callable[..., Any]]:
        """The first usable route's implementation (None when no route is usable: the reference serves)."""
        return self.active[0].fn if self.active else None

    @property
    def route_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.routes)


def select(registry: Registry, name: str | None = None) -> BackendRecord:
    """The backend named (or in ``DSAHAL_BACKEND``), else the highest-priority available one."""
    name = name or os.environ.get("DSAHAL_BACKEND") or None
    if name is not None:
        record = registry.records.get(name)
        if record is None:
            raise RegistryError(f"unknown backend {name!r}; the backends that exist are:\n{registry.describe_all()}")
        if not record.available:
            raise RegistryError(
                f"backend {name!r} is not available here: {record.reason}\nall backends:\n{registry.describe_all()}"
            )
        return record
    available = [r for r in registry.records.values() if r.available]
    if not available:
        raise RegistryError(f"no backend is available:\n{registry.describe_all()}")
    return max(available, key=lambda r: (r.backend.priority, r.backend.name == "reference", r.backend.name))


def _summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# Seconds a route's probe may take before the route is off for the process (the probe keeps running in its
# daemon thread; its late answer is ignored). Far above the backend's PROBE_TIMEOUT_S: a route probe may load a
# kernel library or initialise the device (FlashMLA's reads the GPU's capability), which a cold process pays
# once; only a probe that blocks (a hung driver query) reaches it, and without a bound it would hang every
# process that selects the backend, and `dsahal backends --verbose`, which resolves every available backend.
ROUTE_PROBE_TIMEOUT_S = 30.0


def _probe_route(backend: str, op: str, route: Route) -> tuple[bool, str]:
    """``(ok, reason)`` of a route's probe, run in a daemon thread for at most :data:`ROUTE_PROBE_TIMEOUT_S`;
    a probe that raises (``SystemExit`` from a vendor library's import included), blocks or answers anything
    but ``(ok, reason)`` says no, with the reason."""
    answer: dict = {}
    context = contextvars.copy_context()  # the caller's use_backend/use_routes state, as an inline call saw it

    def run():
        try:
            answer["result"] = context.run(lambda: resolve_lazy(route.probe)())
        except BaseException as exc:  # noqa: BLE001 - reported as the route's reason, never fatal
            answer["error"] = exc

    thread = threading.Thread(target=run, name=f"dsahal-route-probe-{backend}-{op}-{route.name}", daemon=True)
    thread.start()
    thread.join(ROUTE_PROBE_TIMEOUT_S)
    if "error" in answer:
        return False, f"probe raised {_summary(answer['error'])}"
    if "result" not in answer:
        return False, (f"probe did not answer within {ROUTE_PROBE_TIMEOUT_S:g} s "
                       f"(dsahal.registry.table.ROUTE_PROBE_TIMEOUT_S)")
    result = answer["result"]
    if not (isinstance(result, tuple) and len(result) == 2):
        return False, f"probe returned {_short(result)}, expected (ok, reason)"
    return bool(result[0]), str(result[1])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _verdict(answer: Any) -> tuple[bool, str]:
    """A verifier's answer as ``(ok, reason)``. Anything but a 2-tuple declines, saying what came back: read
    as before, ``True`` or ``None`` declined as "verifier raised TypeError: cannot unpack..." and a string
    (``"no"``) or a longer tuple was taken as a yes on the fast path."""
    if isinstance(answer, tuple) and len(answer) == 2:
        ok, why = bool(answer[0]), "" if answer[1] is None else str(answer[1])
        return ok, why or ("" if ok else "declined (no reason given)")
    return False, f"verifier returned {_short(answer)}, expected (ok, reason)"


def _resolve_route(backend: str, op: str, route: Route) -> ResolvedRoute:
    """Probe, import and signature-check one route; any failure makes it unavailable, never fatal."""
    if route.probe is not None:
        ok, why = _probe_route(backend, op, route)
        if not ok:
            return ResolvedRoute(route.name, None, None, False, why)
    parts = {}
    for role, lazy in (("implementation", route.fn), ("verifier", route.verifier)):
        if lazy is None:
            parts[role] = None
            continue
        try:
            parts[role] = adapt_to_spec(op, resolve_lazy(lazy), f"backend {backend!r} route {route.name!r} {role}")
        except SignatureMismatch as exc:
            return ResolvedRoute(route.name, None, None, False, str(exc))
        except KeyboardInterrupt:  # the user's interrupt is not the route's failure
            raise
        except BaseException as exc:  # noqa: BLE001 - an import failure (sys.exit in a vendor library's
            # import included) disables this route only, never the process nor `dsahal backends`
            where = lazy if isinstance(lazy, str) else getattr(lazy, "__qualname__", repr(lazy))
            return ResolvedRoute(route.name, None, None, False,
                                 f"cannot load the {role} {where!r} of backend {backend!r} op {op!r}: {_summary(exc)}")
    return ResolvedRoute(route.name, parts["implementation"], parts["verifier"], True, route.description)


class OpTable:
    """The resolved dispatch table of one backend, with the reference behind every op.

    Attributes:
        record: the selected backend's registry record.
        entries: ``{op: OpEntry}`` (routes, availability, reasons) for reports.
        dispatch: ``{op: callable}`` taking the op's spec arguments positionally: the hot path.
        overrides: the route overrides applied (``DSAHAL_ROUTES`` and ``use_routes``).
    """

    def __init__(self, record: BackendRecord, reference: BackendRecord, op_names, composite_ops, strict=None,
                 route_overrides: overrides.RouteOverrides | None = None, overrides_apply_to_all: bool = True,
                 overrides_source: str = overrides.ENV):
        self.record = record
        self.source = overrides_source  # who asked for the overrides, as messages name it
        self.strict = settings.env_flag(settings.STRICT) if strict is None else strict
        self.overrides = route_overrides if route_overrides is not None else \
            overrides.parse(os.environ.get(overrides.ENV))
        self.reference = {op: resolve_lazy(reference.backend.routes(op)[0].fn) for op in op_names}
        self._logged: set[tuple[str, str]] = set()
        self._log_lock = threading.Lock()
        if not overrides_apply_to_all:
            self.overrides = self._applicable(self.overrides, op_names, composite_ops)
        self._check_overrides(op_names, composite_ops)
        self.entries: dict[str, OpEntry] = {}
        self.dispatch: dict[str, Callable[..., Any]] = {}
        for op in op_names:
            entry = self._resolve_op(op, op in composite_ops)
            self.entries[op] = entry
            self.dispatch[op] = self._make_dispatch(entry)

    @property
    def name(self) -> str:
        return self.record.backend.name

    # ---- resolution -------------------------------------------------------------------------------

    def _declared(self, op: str, composite: bool) -> list[Route]:
        routes = list(self.record.backend.routes(op)) if self.record.backend.name != "reference" else []
        if composite and self.record.backend.name != "reference":
            routes.append(Route(COMPOSITE_ROUTE, COMPOSITE_IMPLEMENTATIONS[op],
                                description="composed from the backend's own ops"))
        return routes

    def _applicable(self, wanted: overrides.RouteOverrides, op_names, composite_ops) -> overrides.RouteOverrides:
        """``DSAHAL_ROUTES`` names the selected backend's routes; a table of another backend in the same
        process (``use_backend("reference")`` for a check, say) keeps only the items that name its own."""
        def known(op: str) -> set[str]:
            if op not in op_names:
                return set()
            return {r.name for r in self._declared(op, op in composite_ops)} | {overrides.REFERENCE}

        forced = {op: route for op, route in wanted.forced.items() if op not in op_names or route in known(op)}
        disabled = {op: frozenset(r for r in routes if r in known(op)) for op, routes in wanted.disabled.items()}
        return overrides.RouteOverrides(forced, {op: routes for op, routes in disabled.items() if routes})

    def _check_overrides(self, op_names, composite_ops) -> None:
        named = {**{op: {route} for op, route in self.overrides.forced.items()},
                 **{op: set(routes) for op, routes in self.overrides.disabled.items()}}
        for op, routes in named.items():
            if op not in op_names:
                raise RegistryError(f"{self.source}: unknown op {op!r}; the ops are: {', '.join(op_names)}")
            known = [r.name for r in self._declared(op, op in composite_ops)]
            for route in routes - {overrides.REFERENCE}:
                if route not in known:
                    raise RegistryError(
                        f"{self.source}: backend {self.name!r} has no route {route!r} for {op}; its routes are: "
                        f"{', '.join(known + [overrides.REFERENCE])}")

    def _resolve_op(self, op: str, composite: bool) -> OpEntry:
        backend = self.record.backend.name
        declared = self._declared(op, composite)
        forced = self.overrides.forced.get(op)
        disabled = self.overrides.disabled.get(op, frozenset())
        resolved = []
        for route in declared:
            if forced is not None and route.name != forced:
                resolved.append(ResolvedRoute(route.name, None, None, False,
                                              f"not forced ({self.source} forces {op}:{forced})"))
            elif route.name in disabled:
                resolved.append(ResolvedRoute(route.name, None, None, False, f"disabled ({self.source})"))
            else:
                resolved.append(_resolve_route(backend, op, route))
        if forced not in (None, overrides.REFERENCE):
            chosen = next(r for r in resolved if r.name == forced)
            if not chosen.available:
                raise RegistryError(f"{self.source}: route {forced!r} of {op} on backend {backend!r} is "
                                    f"unavailable: {chosen.reason}")
        active = tuple(r for r in resolved if r.available)
        if backend == "reference":
            return OpEntry(op, backend, "native", "the reference", (), ())
        if not declared:
            return OpEntry(op, "reference", "fallback", f"backend {backend!r} does not implement {op}", (), ())
        if not active:
            reasons = "; ".join(f"{r.name}: {r.reason}" for r in resolved)
            return OpEntry(op, "reference", "fallback", f"no route of backend {backend!r} is usable ({reasons})",
                           tuple(resolved), ())
        status = "composite" if active[0].name == COMPOSITE_ROUTE else "native"
        return OpEntry(op, backend, status, "", tuple(resolved), active)

    # ---- calls ------------------------------------------------------------------------------------

    def _make_dispatch(self, entry: OpEntry) -> Callable[..., Any]:
        op, chain = entry.op, tuple((r.name, r.fn, r.verifier) for r in entry.active)
        watching = observers.OBSERVERS  # the live list: registering an observer needs no rebuild
        observed = self._observed

        if not chain:
            if self.record.backend.name == "reference":
                reference = self.reference[op]

                def dispatch(*args):
                    if watching:
                        return observed(op, args)
                    return reference(*args)
            else:
                def dispatch(*args):
                    if watching:
                        return observed(op, args)
                    return self._fall_back(op, entry.reason, args)
        elif len(chain) == 1 and chain[0][2] is None:
            fn = chain[0][1]

            def dispatch(*args):
                if watching:
                    return observed(op, args)
                return fn(*args)
        else:
            def dispatch(*args):
                if watching:
                    return observed(op, args)
                for _, fn, verifier in chain:
                    if verifier is None:
                        return fn(*args)
                    try:
                        answer = verifier(*args)
                        # only an (ok, reason) pair accepts: the slow path below names any other answer
                        ok = answer[0] if isinstance(answer, tuple) and len(answer) == 2 else False
                    except Exception:  # noqa: BLE001 - the slow path below names and logs it
                        ok = False
                    if ok:
                        return fn(*args)
                return self._decline_all(op, args)
        dispatch.__name__ = dispatch.__qualname__ = f"dispatch_{op}"
        return dispatch

    def call(self, op: str, *args):
        """Serve one call of ``op`` (arguments in the order of its spec)."""
        return self.dispatch[op](*args)

    def choose(self, op: str, *args) -> tuple[Optional[str], list[tuple[str, str]]]:
        """The route that would serve these arguments (None: the reference), and each refusal before it.
        Reads metadata only, like the verifiers."""
        entry = self.entries[op]
        declined = [(r.name, r.reason) for r in entry.routes if not r.available]
        if self.record.backend.name == "reference":
            return overrides.REFERENCE, []
        for route in entry.active:
            if route.verifier is None:
                return route.name, declined
            try:
                answer = route.verifier(*args)
            except Exception as exc:  # noqa: BLE001 - a raising verifier declines, named and logged once
                ok, why = False, f"verifier raised {_summary(exc)}"
                self._log_once(op, f"backend {self.name!r} op {op} route {route.name!r}: {why}")
            else:
                ok, why = _verdict(answer)
                if not ok and why.startswith("verifier returned "):  # a broken verifier, not a refusal
                    self._log_once(op, f"backend {self.name!r} op {op} route {route.name!r}: {why}")
            if ok:
                return route.name, declined
            declined.append((route.name, str(why)))
        return None, declined

    def explain(self, op: str, *args) -> str:
        """One line: which route would serve this call, or why every route declines."""
        route, declined = self.choose(op, *args)
        if route is not None:
            return f"{op}: route {route!r} of backend {self.name!r}"
        return f"{op}: the reference ({self.entries[op].reason or _join(declined)})"

    def _decline_all(self, op: str, args):
        """Every verifier said no on the fast path: redo the choice with reasons (and logging of raising
        verifiers), then serve the fallback."""
        route, declined = self.choose(op, *args)
        if route is not None:  # a verifier that answers differently on a second look: trust its "yes"
            return next(r.fn for r in self.entries[op].active if r.name == route)(*args)
        return self._fall_back(op, _join(declined), args)

    def _fall_back(self, op: str, reason: str, args):
        if self.strict:
            raise FallbackError(f"dsahal.{op}: backend {self.name!r} would fall back to the reference "
                                f"({reason}) and DSAHAL_STRICT=1 forbids it")
        self._log_once(op, f"dsahal.{op}: falling back to the reference on backend {self.name!r}: {reason}")
        return self.reference[op](*args)

    def _log_once(self, op: str, message: str) -> None:
        key = (op, message)
        with self._log_lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning("%s", message)

    def _observed(self, op: str, args: tuple):
        entry = self.entries[op]
        if self.record.backend.name == "reference":
            route, declined, fn = overrides.REFERENCE, [], self.reference[op]
        else:
            route, declined = self.choose(op, *args)
            fn = None if route is None else next(r.fn for r in entry.active if r.name == route)
        fallback = route is None
        reason = (entry.reason or _join(declined)) if fallback else ""
        if fallback:
            if self.strict:
                return self._fall_back(op, reason, args)  # raises
            self._log_once(op, f"dsahal.{op}: falling back to the reference on backend {self.name!r}: {reason}")
            route, fn = overrides.REFERENCE, self.reference[op]
        call = observers.OpCall(op, self.name, route, fallback, reason, tuple(declined), args)
        watchers = tuple(observers.OBSERVERS)
        for watcher in watchers:
            watcher.before(call)
        try:
            return fn(*args)
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            for watcher in reversed(watchers):
                watcher.after(call)


def _join(declined) -> str:
    return "; ".join(f"{name}: {why}" for name, why in declined) or "no route"
