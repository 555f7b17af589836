"""``dsahal backends``: every backend, whether it is available and why not, its op coverage."""
from __future__ import annotations

import json
import sys

from ..ops.catalog import COMPOSITE_OPS, OP_NAMES
from ..registry import RegistryError, registry, select


def coverage(backend) -> dict[str, str]:
    """op -> "native" | "composite" | "fallback" for a backend's declaration."""
    result = {}
    for op in OP_NAMES:
        if op in backend.ops:
            result[op] = "native"
        elif op in COMPOSITE_OPS:
            result[op] = "composite"
        else:
            result[op] = "fallback"
    return result


def describe(reg) -> list[dict]:
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
    return rows


def _print_table(rows, reg, selected) -> None:
    print(f"{'backend':<12} {'available':<10} {'native ops':<11} tags / reason")
    for row in rows:
        native = sum(1 for s in row["coverage"].values() if s == "native")
        mark = "*" if row["name"] == selected else " "
        print(f"{mark}{row['name']:<11} {'yes' if row['available'] else 'no':<10} "
              f"{native:>2}/{len(OP_NAMES):<8} {','.join(row['tags'])}")
        print(f"{'':<35}{row['reason']}")
        if row["available"] or row["name"] == "reference":
            fallback = [op for op, s in row["coverage"].items() if s == "fallback"]
            native_ops = [op for op, s in row["coverage"].items() if s == "native"]
            print(f"{'':<35}native: {', '.join(native_ops) or '-'}")
            print(f"{'':<35}fallback to reference: {', '.join(fallback) or '-'}")
        # Keys named "path ..." describe one implementation path each (e.g. AMD's AITER/FlyDSL/Triton):
        # one line per path reads better than one long joined line.
        paths = {k: v for k, v in row["versions"].items() if k.startswith("path ")}
        versions = ", ".join(f"{k} {v}" for k, v in row["versions"].items() if k not in paths)
        if versions:
            print(f"{'':<35}{versions}")
        for key, value in paths.items():
            print(f"{'':<35}{key}: {value}")
        for op, why in row["unverified"].items():
            print(f"{'':<35}unverified on hardware: {op}: {why}")
    for failure in reg.failures:
        print(f"!plugin {failure.plugin}: failed at {failure.stage}: {failure.error}")
    for plugin in reg.excluded:
        print(f"-plugin {plugin}: not loaded (not in DSAHAL_PLUGINS)")
    if selected:
        print(f"\nselected: {selected}  (* above; DSAHAL_BACKEND overrides)")


def run(args) -> int:
    try:
        reg = registry()
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = describe(reg)
    selected, error = None, None
    try:
        selected = select(reg).backend.name
    except RegistryError as exc:
        error = str(exc)
    if args.json:
        print(json.dumps({"selected": selected, "error": error, "backends": rows,
                          "failures": [vars(f) for f in reg.failures], "excluded": reg.excluded}, indent=2))
    else:
        _print_table(rows, reg, selected)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("backends", help="list backends, availability and op coverage",
                                   description=__doc__)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
