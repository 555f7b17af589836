"""Progress of a long ``dsahal run`` on stderr, one phase at a time (weights, compile, prefill, decode).

On a terminal (or with ``--progress``) each phase draws a bar from its first step, redrawn in place::

    weights  [##########....................]  12/37 tensors  3.1 s

and ends with the phase's time. Elsewhere (a log file, CI) a phase prints one line when it ends, so
logs show where time went without carriage returns. ``enabled=False`` (DCP ranks other than 0) prints
nothing.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional, TextIO


class PhaseProgress:
    """One phase: :meth:`advance` per unit of work, :meth:`close` when done (idempotent).

    Args:
        name: the phase ("weights", "prefill", ...), printed first.
        total: units expected (the bar's width); a phase may end early or run over.
        unit: what a unit is ("tensors", "steps").
        enabled: print anything at all.
        live: redraw a bar in place (a terminal); otherwise one line at the end.
    """

    WIDTH = 30

    def __init__(self, name: str, total: int, unit: str, *, enabled: bool = True, live: Optional[bool] = None,
                 out: Optional[TextIO] = None):
        self.out = out or sys.stderr
        self.name, self.total, self.unit, self.done = name, max(int(total), 1), unit, 0
        self.enabled = enabled
        self.live = enabled and (self.out.isatty() if live is None else live)
        self.start = time.perf_counter()
        self.closed = False
        if self.live:
            self._draw()

    def _draw(self) -> None:
        filled = min(self.WIDTH, self.WIDTH * self.done // self.total)
        elapsed = time.perf_counter() - self.start
        self.out.write(f"\r{self.name:<8} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                       f"{self.unit}  {elapsed:.1f} s")
        self.out.flush()

    def advance(self, units: int = 1) -> None:
        self.done += units
        if self.live:
            self._draw()

    def close(self, note: str = "") -> float:
        """End the phase; returns its seconds."""
        elapsed = time.perf_counter() - self.start
        if self.closed:
            return elapsed
        self.closed = True
        if self.live:
            self._draw()
            self.out.write(f"{('  ' + note) if note else ''}\n")
        elif self.enabled:
            self.out.write(f"{self.name:<8} {self.done} {self.unit} in {elapsed:.1f} s{('  ' + note) if note else ''}\n")
        self.out.flush()
        return elapsed


def say(text: str, *, enabled: bool = True, out: Optional[TextIO] = None) -> None:
    """One status line on stderr (e.g. that compiling starts), flushed at once."""
    if enabled:
        stream = out or sys.stderr
        stream.write(text + "\n")
        stream.flush()


def process_age() -> Optional[float]:
    """Seconds since this process started (Linux: its start time in ``/proc/self/stat`` against
    ``/proc/uptime``, 10 ms resolution), or None where that is not readable. ``dsahal run`` measures its
    start-up (interpreter, imports) and its first token from there."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the stat line, 20th after the name
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)
