"""The ``dsahal`` command. Each sub-command lives in its own module of this package and exposes
``register(subparsers)``; ``register`` attaches a ``func(args) -> int`` through ``set_defaults``."""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from .._version import __version__

# Sub-command modules, in the order --help lists them. A module that is absent is skipped.
COMMAND_MODULES = ("backends", "run", "plan", "conformance", "bench", "new_backend")


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors (a wrong type or choice, an unknown flag or command, a missing
    argument) are one ``error:`` line on stderr and exit status 2, as every other error of the command is:
    argparse's own form prints the whole usage block before its message. Sub-command parsers take this
    class too (``add_subparsers`` builds them with the parent's class)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook; never returns
        self.exit(2, f"error: {self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
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
    parser.set_defaults(commands=list(subparsers.choices))  # (named when no command is given)
    _plain_help(parser)
    return parser


_ROLE = re.compile(r":[\w:]+:`([^`]+)`")  # :mod:`x`, :func:`~a.b`, :ref:`text <target>`
_LITERAL = re.compile(r"``([^`]+)``")


def _role_text(match: re.Match) -> str:
    inner = match.group(1)
    if "<" in inner:  # `text <target>`: the text
        return inner.split("<", 1)[0].strip()
    if inner.startswith("~"):  # `~a.b.c`: the last name
        return inner.rsplit(".", 1)[-1]
    return inner.lstrip(".")


def plain_text(text: str | None) -> str | None:
    """The reStructuredText markup of the modules' docstrings (which double as ``--help`` descriptions)
    turned into plain text for the terminal: double-backquoted literals lose their quotes, and roles
    (mod, func, class, ref, ...) become their target's name (the last part with a leading tilde, the
    link text of a ``text <target>`` form)."""
    if not text:
        return text
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_text, text))


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """Every description, epilog and argument help of ``parser`` and its sub-commands as plain text."""
    parser.description, parser.epilog = plain_text(parser.description), plain_text(parser.epilog)
    for action in parser._actions:
        action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for listed in action._choices_actions:  # the sub-command list of `dsahal --help`
                listed.help = plain_text(listed.help)
            for sub in set(action.choices.values()):
                _plain_help(sub)


def check_output_path(path: str) -> None:
    """``ValueError`` unless a file can be written at ``path`` (its folder exists and is writable, and it is
    not a folder): the commands check their ``--json`` file before a run whose report it would hold."""
    import os

    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise ValueError(f"expected a file to write, got the directory {path!r}")
    if not os.path.isdir(folder):
        raise ValueError(f"expected a file in an existing directory, got {path!r} (no directory {folder!r})")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"expected a writable file, got {path!r} (permission denied)")


def main(argv: list[str] | None = None) -> int:
    from ..registry import FallbackError, RegistryError

    try:
        parser = build_parser()
    except RegistryError as exc:  # a setting read when a command's modules import (DSAHAL_FAST_LAUNCH=2)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # plain `dsahal`: a usage error like any other, one line
        print(f"error: dsahal: a COMMAND is required, one of {', '.join(parser.get_default('commands'))} "
              f"(dsahal --help describes them)", file=sys.stderr)
        return 2

    try:
        return int(args.func(args) or 0)
    except FallbackError as exc:  # DSAHAL_STRICT=1 did its job: the message names op, backend and reason
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RegistryError as exc:  # a configuration error (DSAHAL_ROUTES, an unknown backend...), not a bug
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dsahal ... | head`: the reader left; end quietly, as a SIGPIPE'd command does
        sys.stderr.close()
        return 141


if __name__ == "__main__":
    sys.exit(main())
