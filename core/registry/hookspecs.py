"""The extension points a backend plugin implements (pluggy project name ``dsahal``).

A plugin is any module or object reachable through the ``dsahal.backends`` entry-point group
that carries ``@hookimpl``-marked functions with these names.
"""
from __future__ import annotations

import pluggy

PROJECT = "dsahal"
ENTRY_POINT_GROUP = "dsahal.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dsahal_backends():
    """Return the :class:`dsahal.Backend` objects this plugin provides (a list, usually of one).

    Called once per process, at start-up. Must be cheap and free of side effects: import no
    kernel library, touch no device. Heavy imports belong in the op functions, which may be
    given as ``"module:attribute"`` strings and are imported only when the backend is selected.
    """
