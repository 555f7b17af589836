"""The suite's run settings, set once by the pytest plugin before any test module is imported."""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_EXAMPLES = 60  # the full budget: what `dsahal conformance` runs unless told otherwise


@dataclass
class SuiteConfig:
    """``backend``: the backend under test (None: ``DSAHAL_BACKEND`` or automatic selection).
    ``ops``: restrict to these op families (None: all). ``seed``: hypothesis seed (None: random).
    ``device``: where op arguments are placed (None: inferred from the backend's tags)."""

    backend: str | None = None
    max_examples: int = DEFAULT_MAX_EXAMPLES
    min_examples: int = 0  # a floor under every property's scaled budget (--min-examples)
    derandomize: bool = False
    seed: int | None = None
    ops: frozenset[str] | None = None
    report_dir: str | None = None
    device: str | None = None
    skips_file: str | None = None
    xfails_file: str | None = None
    extra: dict = field(default_factory=dict)

    def examples(self, scale: float = 1.0) -> int:
        """The example budget of one property: ``max_examples`` scaled for expensive ones, at least
        ``min_examples`` (and 1)."""
        return max(1, self.min_examples, int(round(self.max_examples * scale)))


CONFIG = SuiteConfig()
