"""Traffic accounting of the exact top-k merge: what one merge sent, and process-wide totals
(``dsahal.distributed.merge_traffic``), compared with the generic merge."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

GENERIC_BYTES_PER_CANDIDATE = 8  # fp32 score + int32 id
RECENT_MERGES = 256


def generic_payload_bytes(rows: int, k: int) -> int:
    """Bytes one rank contributes to the generic merge of ``rows`` rows: its full local top-k as
    fp32 score + int32 id (:mod:`.generic_merge`)."""
    return rows * k * GENERIC_BYTES_PER_CANDIDATE


@dataclass(frozen=True)
class MergeStats:
    """Traffic of one merge on one rank. ``*_bytes`` are payloads this rank contributed to collectives;
    each reaches the ``W - 1`` peers, which :attr:`wire_bytes` counts."""

    world: int
    rows: int
    k: int
    candidates: int
    key_bits: int
    first_round_bytes: int
    resend_bytes: int
    resend_rows: tuple[int, ...]  # flagged rows per rank
    band_bytes: int = 0  # this rank's band-round payload (raw fp32 scores, ids where needed)
    band_rows: int = 0  # rows whose rounding class needed raw scores (the same on every rank)
    completion_bytes: int = 0  # the completion that replaced the band round where it was cheaper
    generic_bytes: int = 0  # the generic merge's payload, when the call used it outright
    protocol: str = "exact"  # "exact", "exact+completion" or "generic": what bounded the call

    @property
    def payload_bytes(self) -> int:
        return (self.first_round_bytes + self.resend_bytes + self.band_bytes + self.completion_bytes
                + self.generic_bytes)

    @property
    def wire_bytes(self) -> int:
        return self.payload_bytes * (self.world - 1)

    @property
    def generic_payload_bytes(self) -> int:
        """What the generic merge (full local top-k as fp32 score + int32 id) would contribute."""
        return generic_payload_bytes(self.rows, self.k)

    @property
    def traffic_ratio(self) -> float:
        return self.generic_payload_bytes / self.payload_bytes


@dataclass
class MergeTrafficLog:
    """Totals over every merge this process ran since :meth:`reset`, and the most recent merges
    (``dsahal.distributed.merge_traffic``). Bounded: a serving process merges every layer and step."""

    calls: int = 0
    payload_bytes: int = 0
    generic_payload_bytes: int = 0
    resent_rows: int = 0
    band_rows: int = 0
    rows: int = 0
    completion_calls: int = 0  # calls whose band rows were settled by the completion
    generic_calls: int = 0  # calls that used the generic merge outright
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_MERGES))

    @property
    def last(self) -> Optional[MergeStats]:
        return self.recent[-1] if self.recent else None

    def record(self, stats: MergeStats) -> None:
        self.calls += 1
        self.payload_bytes += stats.payload_bytes
        self.generic_payload_bytes += stats.generic_payload_bytes
        self.resent_rows += sum(stats.resend_rows)
        self.band_rows += stats.band_rows
        self.rows += stats.rows
        self.completion_calls += stats.protocol == "exact+completion"
        self.generic_calls += stats.protocol == "generic"
        self.recent.append(stats)

    def reset(self) -> None:
        self.calls = self.payload_bytes = self.generic_payload_bytes = self.resent_rows = 0
        self.band_rows = self.rows = self.completion_calls = self.generic_calls = 0
        self.recent.clear()


merge_traffic = MergeTrafficLog()
