"""``dsahal backends``: every backend, whether it is available and why not, its op coverage; with
``--verbose``, every op's routes in the order calls try them, each usable or not and why.

Below the table, every plugin fault: a plugin that failed to import or register, one that loaded but
registered nothing (no ``@hookimpl``), unknown op names a backend declares, backend names two plugins
declare (which one is used and how to pick the other), probes that raised or timed out (every probe
runs, in parallel, each bounded by ``dsahal.registry.discovery.PROBE_TIMEOUT_S``), and
``DSAHAL_PLUGINS`` entries that name no plugin."""
from __future__ import annotations

import json
import sys

from ..ops.catalog import COMPOSITE_OPS, OP_NAMES
from ..registry import OpTable, RegistryError, registry, select
from ..registry.discovery import unknown_entry_text


def coverage(backend) -> dict[str, str]:
    """op -> "native" | "composite" | "fallback" for a backend's declaration."""
    result = {}
    for op in OP_NAMES:
        if backend.routes(op):
            result[op] = "native"
        elif op in COMPOSITE_OPS:
            result[op] = "composite"
        else:
            result[op] = "fallback"
    return result


def route_rows(record, reg) -> dict[str, list[dict]]:
    """op -> its routes as resolved here (usable or not, and why). An unavailable backend's routes are
    listed as declared, unresolved: resolving would import its kernel libraries. The reference serves
    every op itself, as the one route ``reference`` (the name ``DSAHAL_ROUTES`` and the reports use)."""
    backend = record.backend
    if backend.name == "reference":
        return {op: [{"name": "reference", "available": True, "reason": "the float64 oracle (dsahal/reference/)"}]
                for op in OP_NAMES if backend.routes(op)}
    if not record.available:
        return {op: [{"name": r.name, "available": None, "reason": r.description or "not resolved: backend unavailable"}
                     for r in backend.routes(op)] for op in OP_NAMES if backend.routes(op)}
    table = OpTable(record, reg.records["reference"], OP_NAMES, COMPOSITE_OPS)
    return {op: [{"name": r.name, "available": r.available, "reason": r.reason} for r in entry.routes]
            for op, entry in table.entries.items() if entry.routes}


def describe(reg, *, with_routes: bool = True) -> list[dict]:
    rows = []
    for name, record in sorted(reg.records.items(), key=lambda kv: (-kv[1].backend.priority, kv[0])):
        backend = record.backend
        try:
            versions = dict(backend.versions())
        except Exception as exc:  # noqa: BLE001 - a report must not die on one backend's metadata
            versions = {"error": f"{type(exc).__name__}: {exc}"}
        rows.append({
            "name": name,
            "available": record.available,
            "reason": record.reason,
            "tags": sorted(backend.tags),
            "priority": backend.priority,
            "plugin": record.plugin,
            "coverage": coverage(backend),
            "unverified": dict(backend.capabilities.unverified),
            "versions": versions,
        })
        if with_routes:
            try:
                rows[-1]["routes"] = route_rows(record, reg)
            except RegistryError as exc:  # e.g. DSAHAL_ROUTES naming a route this backend lacks
                rows[-1]["routes_error"] = str(exc)
    return rows


def _print_table(rows, reg, selected, verbose: bool) -> None:
    width = max([len("backend") - 1] + [len(row["name"]) for row in rows])  # (the name column after the mark)
    print(f"{'backend':<{width + 1}} {'available':<10} {'native ops':<11} reason")
    for row in rows:
        native = sum(1 for s in row["coverage"].values() if s == "native")
        mark = "*" if row["name"] == selected else " "
        print(f"{mark}{row['name']:<{width}} {'yes' if row['available'] else 'no':<10} "
              f"{native:>2}/{len(OP_NAMES):<8} {row['reason']}")
        if not verbose:
            continue
        print(f"{'':<4}tags: {','.join(row['tags'])}; plugin {row['plugin']}; priority {row['priority']}")
        fallback = [op for op, s in row["coverage"].items() if s == "fallback"]
        if fallback:
            print(f"{'':<4}served by the reference: {', '.join(fallback)}")
        for op, routes in row.get("routes", {}).items():
            print(f"{'':<4}{op}:")
            for route in routes:
                state = {True: "on ", False: "off", None: "   "}[route["available"]]
                print(f"{'':<8}{state} {route['name']:<22} {route['reason']}")
        if row.get("routes_error"):
            print(f"{'':<4}routes: error: {row['routes_error']}")
        paths = {k: v for k, v in row["versions"].items() if k.startswith("path ")}
        versions = ", ".join(f"{k} {v}" for k, v in row["versions"].items() if k not in paths)
        if versions:
            print(f"{'':<4}versions: {versions}")
        for key, value in paths.items():
            print(f"{'':<4}{key}: {value}")
        for op, why in row["unverified"].items():
            print(f"{'':<4}unverified on hardware: {op}: {why}")
    for failure in reg.failures:
        print(f"!plugin {failure.plugin}: failed at {failure.stage}: {failure.error}")
    for conflict in reg.conflicts:
        print(f"!conflict: {conflict.describe()}")
    for plugin in reg.excluded:
        print(f"-plugin {plugin}: not loaded (not in DSAHAL_PLUGINS)")
    for entry in reg.unknown_allowed:
        print(f"?DSAHAL_PLUGINS: {unknown_entry_text(entry, reg.known_plugins)}")
    if selected:
        print(f"\nselected: {selected}  (* above; DSAHAL_BACKEND overrides)" +
              ("" if verbose else "; --verbose lists every op's routes, versions and unverified paths"))


def run(args) -> int:
    try:
        reg = registry()
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reg.probe_all()  # every backend's probe, in parallel, each bounded: the table lists them all
    rows = describe(reg, with_routes=args.json or args.verbose)
    selected, error = None, None
    try:
        record = select(reg)
        selected = record.backend.name
        # the table the ops would use: DSAHAL_ROUTES must name routes of the selected backend (an op call
        # would raise this at its first call; the listing says it now, verbose or not)
        OpTable(record, reg.records["reference"], OP_NAMES, COMPOSITE_OPS)
    except RegistryError as exc:
        error = str(exc)
    if args.json:
        print(json.dumps({"selected": selected, "error": error, "backends": rows,
                          "failures": [vars(f) for f in reg.failures], "excluded": reg.excluded,
                          "conflicts": [vars(c) for c in reg.conflicts],
                          "unknown_in_allow_list": reg.unknown_allowed, "known_plugins": reg.known_plugins},
                         indent=2))
    else:
        _print_table(rows, reg, selected, args.verbose)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("backends", help="list backends, availability and op coverage",
                                   description=__doc__)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every op's routes (usable or not, and why), versions, unverified paths")
    parser.set_defaults(func=run)
