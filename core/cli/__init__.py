"""The ``dsahal`` command. Each sub-command lives in its own module of this package and exposes
``register(subparsers)``; ``register`` attaches a ``func(args) -> int`` through ``set_defaults``."""
from __future__ import annotations

import argparse
import importlib
import sys

from .._version import __version__

# Sub-command modules, in the order --help lists them. A module that is absent is skipped.
COMMAND_MODULES = ("backends", "run", "plan", "conformance", "bench", "new_backend")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsahal",
        description="Hardware abstraction layer for the attention ops of hybrid sparse-attention LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"dsahal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
