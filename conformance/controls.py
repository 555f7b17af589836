"""Vendor controls: skip and xfail files of test-id prefixes.

One entry per line: a test-id prefix, optionally followed by ``# reason``; blank lines and lines
starting with ``#`` are ignored. A prefix matches the canonical id (``test_topk.py::test_name[params]``)
or the full pytest node id. An entry that matches no collected test is stale and produces a warning.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ControlEntry:
    prefix: str
    reason: str
    source: str  # "file:line"
    matched: int = 0


class ControlFileError(ValueError):
    """A control file that exists but cannot be read as text (a usage error, like a missing one)."""


def read_control_file(path: str | Path) -> list[ControlEntry]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dsahal conformance: control file {str(path)!r} does not exist")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ControlFileError(f"dsahal conformance: control file {str(path)!r} cannot be read as text: {exc}") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        prefix, _, comment = line.partition("#")
        entries.append(ControlEntry(prefix.strip(), comment.strip() or "no reason given", f"{path.name}:{number}"))
    return entries


def read_test_ids(path: str | Path) -> list[str]:
    """The node ids a ``--tests`` file lists: one a line, blank lines and ``#`` comments ignored (``OSError`` or
    ``UnicodeDecodeError`` when it cannot be read)."""
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def match_test_ids(listed: list[str], nodeids) -> tuple[dict[str, str], list[str]]:
    """``listed`` ids against the suite's collected ``nodeids`` (full or :func:`canonical_id` form) -> (each
    id found mapped to its collected node id, the ids that name no collected test)."""
    known = {}
    for nodeid in nodeids:
        known[nodeid] = known[canonical_id(nodeid)] = nodeid
    return {test: known[test] for test in listed if test in known}, [test for test in listed if test not in known]


def shown_ids(ids: list[str], most: int = 5) -> str:
    """``a, b, c and N more``: the first ``most`` of ``ids`` for an error line."""
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


def canonical_id(nodeid: str) -> str:
    """``some/dir/test_topk.py::test_x[p]`` -> ``test_topk.py::test_x[p]`` (stable across installs)."""
    path, sep, rest = nodeid.partition("::")
    return Path(path).name + sep + rest


def match(entries: list[ControlEntry], nodeid: str) -> ControlEntry | None:
    """The first entry whose prefix matches ``nodeid`` (its use is counted)."""
    short = canonical_id(nodeid)
    for entry in entries:
        if short.startswith(entry.prefix) or nodeid.startswith(entry.prefix):
            entry.matched += 1
            return entry
    return None


def stale(entries: list[ControlEntry]) -> list[ControlEntry]:
    return [e for e in entries if e.matched == 0]
