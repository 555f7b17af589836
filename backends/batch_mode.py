"""``DSAHAL_BATCH_INVARIANT``: one reading for every backend and the shared kernels' compile budget.

The mode is the process's (one variable, whichever backend serves), so the backends' configurations and
:mod:`dsahal.backends.triton_kernels.compile_budget` all read it here: a second parser could disagree."""
from __future__ import annotations

from dsahal.registry.settings import BATCH_INVARIANT as ENV
from dsahal.registry.settings import env_flag


def invariant_requested() -> bool:
    """``DSAHAL_BATCH_INVARIANT`` on (``1/true/yes/on``; unset, empty or ``0/false/no/off`` is off; any other
    value raises :class:`dsahal.registry.settings.SettingError`)."""
    return env_flag(ENV)
