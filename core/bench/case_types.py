"""What a bench case is (:class:`Case`) and what building it gives (:class:`Built`).

Apart from :mod:`.cases` (the cases themselves) so that a module building a case, such as
:mod:`.model_step`, needs nothing from the list of cases that names it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class Built:
    run: Callable[[], object]
    bytes: float
    flops: float
    baseline: Optional[Callable[[], object]] = None
    peers: dict = field(default_factory=dict)  # name -> callable
    peer_notes: list = field(default_factory=list)  # peers dropped (output disagreed, or failed), one line each
    graph_ok: bool = True
    # Its own CUDA graph: a factory that captures and returns the replay callable (the "graph ms" column).
    graph: Optional[Callable[[], Callable[[], object]]] = None


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    shape: str
    build: Callable[[object], Built]
    check: Callable[[object, str], tuple[bool, str]]  # (device, backend) -> (passed, detail)
    invariant_sensitive: bool = False  # its block sizes change under DSAHAL_BATCH_INVARIANT=1
