"""``DSAHAL_BATCH_INVARIANT``: one reading for every backend and the shared kernels' compile budget.

The mode is the process's (one variable, whichever backend serves), so the backends' configurations and
:mod:`dsahal.backends.triton_kernels.compile_budget` all read it here: a second parser could disagree."""
from __future__ import annotations

import os

ENV = "DSAHAL_BATCH_INVARIANT"


def invariant_requested() -> bool:
    """``DSAHAL_BATCH_INVARIANT`` set (not empty, not ``0``)."""
    return os.environ.get(ENV, "0") not in ("", "0")
