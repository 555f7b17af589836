"""The on/off environment variables that change how dsahal dispatches, read by one parser.

``DSAHAL_STRICT`` (a fallback to the reference raises), ``DSAHAL_BATCH_INVARIANT`` (batch-invariant kernels)
and the backends' own switches (``DSAHAL_PPU_TRITON``, ``DSAHAL_FAST_LAUNCH``) are flags. Each was read as "set and not ``0``", so
``DSAHAL_BATCH_INVARIANT=false`` turned the mode *on* and ``DSAHAL_STRICT=off`` made every fallback an error.
Here a flag is ``1/true/yes/on`` or ``0/false/no/off`` (any case, surrounding blanks ignored); unset or empty
keeps the default; anything else is a :class:`SettingError` naming the variable, what it takes and what it got.
:func:`check_environment` reads every flag and the syntax of ``DSAHAL_ROUTES`` once, when the registry is
discovered, so a mistyped setting stops the process at start-up (the CLI prints one ``error:`` line), not at
the first op call of a server, nor by quietly dropping a backend whose declaration read the flag.
"""
from __future__ import annotations

import os

from . import overrides
from .discovery import RegistryError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

STRICT = "DSAHAL_STRICT"
BATCH_INVARIANT = "DSAHAL_BATCH_INVARIANT"
PPU_TRITON = "DSAHAL_PPU_TRITON"
FAST_LAUNCH = "DSAHAL_FAST_LAUNCH"  # the Triton routes' launch cache (dsahal.kernel_launch)
# every flag dsahal reads, with its default (a vendor plugin reading its own flag calls env_flag directly)
FLAGS = {STRICT: False, BATCH_INVARIANT: False, PPU_TRITON: True, FAST_LAUNCH: True}
# The most scratch memory one stage of a long call allocates, in MiB: the DSA layer's [T, context] fp32 index scores
# (dsahal.ops.score_ranges) and a split sparse-MLA launch's fp32 partials (backends/triton_kernels/partials.py); past
# it a call runs over token ranges (bitwise the same result). Read when those modules are imported.
SCRATCH_MIB = "DSAHAL_SCRATCH_MIB"
SCRATCH_MIB_DEFAULT = 512


class SettingError(RegistryError, ValueError):
    """An environment variable of dsahal's holds a value it does not take."""


def env_flag(name: str, default: bool = False) -> bool:
    """The flag ``name`` of the environment: ``default`` when unset or empty, else its on/off value.

    Raises:
        SettingError: the value is none of ``1/true/yes/on/0/false/no/off`` (case-insensitive).
    """
    raw = os.environ.get(name)
    value = "" if raw is None else raw.strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise SettingError(f"{name}: expected one of {'/'.join(ON)} (on) or {'/'.join(OFF)} (off), or unset, "
                       f"got {raw!r}")


def env_mib(name: str, default: int) -> int:
    """The whole number of MiB (>= 1) in the environment variable ``name``: ``default`` when unset or empty.

    Raises:
        SettingError: the value is not a whole number >= 1.
    """
    raw = os.environ.get(name)
    value = "" if raw is None else raw.strip()
    if not value:
        return default
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise SettingError(f"{name}: expected a whole number of MiB >= 1, or unset, got {raw!r}")


def scratch_bytes() -> int:
    """:data:`SCRATCH_MIB` in bytes (default :data:`SCRATCH_MIB_DEFAULT` MiB). A value it does not take gives the
    default here: :func:`check_environment`, run when the registry is first built, is where it raises."""
    try:
        return env_mib(SCRATCH_MIB, SCRATCH_MIB_DEFAULT) * 2**20
    except SettingError:
        return SCRATCH_MIB_DEFAULT * 2**20


def check_environment() -> None:
    """Read every flag of :data:`FLAGS` and :data:`SCRATCH_MIB`, and parse ``DSAHAL_ROUTES`` (its syntax: which routes it may name
    depends on the backend, checked when that backend's op table is built).

    Raises:
        SettingError: a flag's value is not on/off, or ``DSAHAL_SCRATCH_MIB`` not a whole number >= 1.
        RouteOverrideError: ``DSAHAL_ROUTES`` is malformed.
    """
    for name, default in FLAGS.items():
        env_flag(name, default)
    env_mib(SCRATCH_MIB, SCRATCH_MIB_DEFAULT)
    overrides.parse(os.environ.get(overrides.ENV))
