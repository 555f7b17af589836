"""``dsahal new-backend NAME [--dir D]``: generate an installable vendor plugin package.

The package (``dsahal-NAME``, import name ``dsahal_NAME``) holds a pyproject with the
``dsahal.backends`` entry point, a backend module with a probe, tags and one op (``lse_combine``
in plain torch) with its verifier, a conformance skip file, a CI workflow for a self-hosted runner
of the hardware, a quick test and a README. Straight after generation it passes the conformance
suite with its one op native and every other op on the reference::

    dsahal new-backend acme && pip install -e ./dsahal-acme && dsahal conformance --backend acme

Templates live in ``dsahal/templates/new_backend`` (shipped as package data). In template paths
``PACKAGE`` becomes the import name and ``dot-`` a leading dot (globs skip dot-files, so a
``.github`` folder would not be packaged); ``.tmpl`` is dropped. In contents ``{{key}}`` is
replaced; GitHub's own ``${{ expr }}`` (with spaces) is left alone.
"""
from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path, PurePosixPath

from .._version import __version__

TEMPLATE_ROOT = ("templates", "new_backend")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,38}[a-z0-9]$|^[a-z]$")
PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
BUILTIN_BACKENDS = frozenset({"reference", "nvidia", "amd", "tpu", "ppu"})
DEFAULT_DEVICE_TYPES = ("cpu", "cuda")


class NewBackendError(ValueError):
    """A bad name or target directory; the message says what was expected."""


def check_name(name: str, taken: frozenset[str] = BUILTIN_BACKENDS) -> None:
    """Raise :class:`NewBackendError` unless ``name`` is a fresh, lower-case backend name."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise NewBackendError(
            f"dsahal new-backend: argument 'NAME' expected lower-case letters, digits, '-' or '_', starting "
            f"with a letter, at most 40 characters, got {name!r}")
    # `acme-x` and `acme_x` are two backend names but one package: both become the import package dsahal_acme_x
    # and, by PEP 503 normalisation, the distribution dsahal-acme-x, so installing one replaces the other.
    twins = sorted(t for t in taken if t != name and t.replace("-", "_") == name.replace("-", "_"))
    if twins:
        raise NewBackendError(
            f"dsahal new-backend: argument 'NAME' expected a name no installed backend uses, got {name!r}, whose "
            f"package dsahal_{name.replace('-', '_')} is the one of backend {twins[0]!r} ('-' and '_' name one "
            f"package)")
    if name in taken:
        raise NewBackendError(
            f"dsahal new-backend: argument 'NAME' expected a name no installed backend uses, got {name!r} "
            f"(taken: {', '.join(sorted(taken))}); when two plugins claim one backend name only one is used and the "
            f"conflict is reported")


def template_values(name: str, tags: list[str], device_types: list[str], runner_labels: list[str],
                    priority: int) -> dict[str, str]:
    identifier = name.replace("-", "_")
    return {
        "name": name,
        "identifier": identifier,
        "package": f"dsahal_{identifier}",
        "distribution": f"dsahal-{name}",
        "dsahal_version": __version__,
        "tags": "{" + ", ".join(json.dumps(t) for t in sorted(set(tags))) + "}",
        "device_types": "{" + ", ".join(json.dumps(t) for t in sorted(set(device_types))) + "}",
        "runner_labels": ", ".join(runner_labels),
        "priority": str(priority),
    }


def render(text: str, values: dict[str, str], where: str) -> str:
    def substitute(match: re.Match) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"template {where}: unknown placeholder {{{{{key}}}}}")
        return values[key]

    return PLACEHOLDER.sub(substitute, text)


def _template_files(node, prefix: PurePosixPath = PurePosixPath()):
    """(relative template path, traversable) for every file under the template root."""
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            yield from _template_files(child, prefix / child.name)
        else:
            yield prefix / child.name, child


def output_path(template_path: PurePosixPath, values: dict[str, str]) -> PurePosixPath:
    parts = []
    for part in template_path.parts:
        part = part.replace("PACKAGE", values["package"])
        if part.startswith("dot-"):
            part = "." + part[len("dot-"):]
        parts.append(part[: -len(".tmpl")] if part.endswith(".tmpl") else part)
    return PurePosixPath(*parts)


def generate(name: str, directory: Path | str | None = None, *, tags: list[str] | None = None,
             device_types: list[str] | None = None, runner_labels: list[str] | None = None,
             priority: int = -1, taken: frozenset[str] = BUILTIN_BACKENDS) -> list[Path]:
    """Write the plugin package for backend ``name`` into ``directory`` (default ``./dsahal-NAME``).

    Returns the files written. Raises :class:`NewBackendError` for a bad or taken name, or when
    ``directory`` exists and is not empty (nothing is overwritten).
    """
    check_name(name, taken)
    target = Path(directory) if directory is not None else Path(f"dsahal-{name}")
    if target.exists() and not target.is_dir():
        raise NewBackendError(f"dsahal new-backend: argument '--dir' expected a new or empty directory, "
                              f"got {str(target)!r}, which is a file")
    if target.exists() and any(target.iterdir()):
        raise NewBackendError(f"dsahal new-backend: argument '--dir' expected a new or empty directory, "
                              f"got {str(target)!r}, which is not empty")
    values = template_values(name, tags or [name], device_types or list(DEFAULT_DEVICE_TYPES),
                             runner_labels or ["self-hosted", name], priority)
    root = resources.files("dsahal").joinpath(*TEMPLATE_ROOT)
    written = []
    try:
        for template_path, source in _template_files(root):
            destination = target / output_path(template_path, values)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(render(source.read_text(encoding="utf-8"), values, str(template_path)),
                                   encoding="utf-8")
            written.append(destination)
    except OSError as exc:  # a parent that is a file, no permission, a full disk: the CLI's one error line
        raise NewBackendError(f"dsahal new-backend: argument '--dir' expected a directory that can be created and "
                              f"written, got {str(target)!r}: {exc.strerror or exc} ({exc.filename or target})"
                              f"{'; ' + str(len(written)) + ' files were written before' if written else ''}") from None
    if not written:
        raise NewBackendError(f"dsahal new-backend: no templates found under {root} (a broken install?)")
    return written


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def run(args) -> int:
    from ..registry import RegistryError, registry

    try:
        taken = BUILTIN_BACKENDS | frozenset(registry().records)
    except RegistryError:
        taken = BUILTIN_BACKENDS
    try:
        written = generate(args.name, args.dir, tags=_split(args.tag), device_types=_split(args.device_type),
                           runner_labels=_split(args.runner_label), priority=args.priority, taken=taken)
    except NewBackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = Path(args.dir or f"dsahal-{args.name}")
    print(f"wrote {len(written)} files to {root}/")
    for path in written:
        print(f"  {path.relative_to(root)}")
    print(f"\nnext:\n  pip install -e {root}\n  dsahal conformance --backend {args.name} --skips {root}/skips.txt"
          f"\n  DSAHAL_BACKEND={args.name} dsahal run   # it is never selected automatically (priority {args.priority})")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "new-backend", help="generate an installable backend plugin package",
        description="Generate dsahal-NAME: an installable backend plugin package (entry point, probe, one op "
                    "with its verifier, skip file, self-hosted CI workflow, README) that passes the conformance "
                    "suite as generated, its one op native and every other op on the reference.")
    parser.add_argument("name", metavar="NAME", help="backend name (lower case; the package is dsahal-NAME)")
    parser.add_argument("--dir", default=None, help="directory to create (default: ./dsahal-NAME)")
    parser.add_argument("--tag", action="append", metavar="TAG",
                        help="backend tag, repeatable or comma-separated (default: NAME), e.g. --tag gpu,acme")
    parser.add_argument("--device-type", action="append", metavar="TYPE",
                        help="torch device types the generated op's verifier accepts (default: cpu,cuda)")
    parser.add_argument("--runner-label", action="append", metavar="LABEL",
                        help="labels of the self-hosted CI runner (default: self-hosted,NAME)")
    parser.add_argument("--priority", type=int, default=-1,
                        help="automatic-selection priority (default -1, below the reference's 0: a newly installed "
                             "plugin never becomes the automatic backend; select it with DSAHAL_BACKEND=NAME; "
                             "built-ins are 90-110)")
    parser.set_defaults(func=run)
