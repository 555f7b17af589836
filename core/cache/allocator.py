"""Row allocator: hands single rows to blocks and aligned runs of rows to KDA states, and takes them back.

State slot ``i`` is rows ``[i * rows_per_state, (i + 1) * rows_per_state)``; a slot can be given to a
state only while all its rows are free. To keep whole slots free for states, blocks are taken from
the top of the pool (highest free row first) and states from the bottom (lowest free slot first).

Guarantees: a row is never owned twice; a failed call (out of rows, bad id) raises and changes
nothing; freeing a row that is not owned (or is owned by the other kind) is an error.
"""
from __future__ import annotations

import heapq
import operator

FREE, BLOCK, STATE = 0, 1, 2


def as_int(where: str, name: str, value: object) -> int:
    """``value`` as a Python int. Ids come from block tables and state-id tensors, so NumPy integers and
    one-element integer tensors count as well as ints (``operator.index``); bool, float and str do not (a float
    id would silently name another row once truncated). ``TypeError`` naming the argument otherwise."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    shown = f"{type(value).__name__} {value!r}" if not hasattr(value, "dtype") else f"{value!r}"
    raise TypeError(f"{where}: argument '{name}' expected an int, got {shown}")


class CacheFullError(RuntimeError):
    """The pool has no room for the request; nothing was allocated."""


class RowAllocator:
    """Ownership of ``num_rows`` rows, in units of single rows (blocks) and aligned slots (states)."""

    def __init__(self, num_rows: int, rows_per_state: int):
        num_rows = as_int("dsahal.cache.RowAllocator", "num_rows", num_rows)
        rows_per_state = as_int("dsahal.cache.RowAllocator", "rows_per_state", rows_per_state)
        if num_rows < 1 or rows_per_state < 0:
            raise ValueError(f"dsahal.cache.RowAllocator: expected num_rows >= 1 and rows_per_state >= 0, "
                             f"got {num_rows} and {rows_per_state}")
        self.num_rows = num_rows
        self.rows_per_state = rows_per_state
        self.num_state_slots = num_rows // rows_per_state if rows_per_state else 0
        self._owner = bytearray(num_rows)  # FREE / BLOCK / STATE per row
        self._free_rows = num_rows
        self._slot_free = [rows_per_state] * self.num_state_slots  # free rows in each state slot
        self._states: set[int] = set()
        # Lazy heaps: entries may be stale (row or slot taken since); they are skipped when popped.
        self._block_heap = [-row for row in range(num_rows)]
        heapq.heapify(self._block_heap)
        self._slot_heap = list(range(self.num_state_slots))

    # -- queries -----------------------------------------------------------------------------------
    @property
    def free_rows(self) -> int:
        return self._free_rows

    @property
    def block_rows(self) -> list[int]:
        return [row for row, owner in enumerate(self._owner) if owner == BLOCK]

    @property
    def state_slots(self) -> list[int]:
        return sorted(self._states)

    def owner(self, row: int) -> int:
        """FREE, BLOCK or STATE."""
        return self._owner[row]

    # -- blocks ------------------------------------------------------------------------------------
    def allocate_blocks(self, count: int) -> list[int]:
        count = as_int("dsahal.cache.allocate_blocks", "n", count)
        if count < 0:
            raise ValueError(f"dsahal.cache.allocate_blocks: argument 'n' expected an int >= 0, got {count!r}")
        if count > self._free_rows:
            raise CacheFullError(f"dsahal.cache.allocate_blocks: asked for {count} blocks, only {self._free_rows} "
                                 f"of {self.num_rows} rows are free; nothing was allocated")
        rows = []
        while len(rows) < count:
            row = -heapq.heappop(self._block_heap)
            if self._owner[row] != FREE:
                continue  # stale entry
            self._take(row, BLOCK)
            rows.append(row)
        return rows

    def free_blocks(self, rows) -> None:
        if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
            raise TypeError(f"dsahal.cache.free_blocks: argument 'ids' expected an iterable of block ids, "
                            f"got {type(rows).__name__} {rows!r}")
        rows = [self._check_row("free_blocks", row) for row in rows]
        if len(set(rows)) != len(rows):
            raise ValueError(f"dsahal.cache.free_blocks: argument 'ids' expected distinct block ids, got {rows}")
        for row in rows:
            if self._owner[row] != BLOCK:
                what = "free" if self._owner[row] == FREE else "part of a KDA state"
                raise ValueError(f"dsahal.cache.free_blocks: block {row} is not allocated as a block (it is {what}); "
                                 f"nothing was freed")
        for row in rows:
            self._give_back(row)
            heapq.heappush(self._block_heap, -row)
        self._compact_heaps()

    # -- states ------------------------------------------------------------------------------------
    def allocate_state(self) -> int:
        if not self.num_state_slots:
            raise CacheFullError("dsahal.cache.allocate_state: the pool has no state slot (the model has no KDA "
                                 f"layer, or fewer than rows_per_state={self.rows_per_state} rows)")
        while self._slot_heap:
            slot = heapq.heappop(self._slot_heap)
            if self._slot_free[slot] == self.rows_per_state:
                first = slot * self.rows_per_state
                for row in range(first, first + self.rows_per_state):
                    self._take(row, STATE)
                self._states.add(slot)
                return slot
        raise CacheFullError(
            f"dsahal.cache.allocate_state: no aligned run of {self.rows_per_state} free rows "
            f"({self._free_rows} of {self.num_rows} rows are free but blocks or states sit in every slot); "
            f"nothing was allocated")

    def free_state(self, slot: int) -> None:
        slot = as_int("dsahal.cache.free_state", "state_id", slot)
        if slot not in self._states:
            raise ValueError(f"dsahal.cache.free_state: argument 'state_id' expected an allocated state id "
                             f"(one of {self.state_slots}), got {slot!r}")
        self._states.remove(slot)
        first = slot * self.rows_per_state
        for row in range(first, first + self.rows_per_state):
            self._give_back(row)
            heapq.heappush(self._block_heap, -row)
        self._compact_heaps()

    # -- internals ---------------------------------------------------------------------------------
    def _check_row(self, method: str, row: object) -> int:
        row = as_int(f"dsahal.cache.{method}", "ids", row)
        if not 0 <= row < self.num_rows:
            raise ValueError(f"dsahal.cache.{method}: argument 'ids' expected block ids in [0, {self.num_rows}), "
                             f"got {row!r}")
        return row

    def _slot_of(self, row: int) -> int | None:
        if not self.rows_per_state:
            return None
        slot = row // self.rows_per_state
        return slot if slot < self.num_state_slots else None

    def _take(self, row: int, owner: int) -> None:
        assert self._owner[row] == FREE, f"row {row} owned twice"  # internal invariant, not input checking
        self._owner[row] = owner
        self._free_rows -= 1
        slot = self._slot_of(row)
        if slot is not None:
            self._slot_free[slot] -= 1

    def _give_back(self, row: int) -> None:
        self._owner[row] = FREE
        self._free_rows += 1
        slot = self._slot_of(row)
        if slot is not None:
            self._slot_free[slot] += 1
            if self._slot_free[slot] == self.rows_per_state:
                heapq.heappush(self._slot_heap, slot)

    def _compact_heaps(self) -> None:
        """Drop stale heap entries once they outnumber live ones (bounds memory under long churn)."""
        if len(self._block_heap) > 2 * self.num_rows + 64:
            self._block_heap = [-row for row in range(self.num_rows) if self._owner[row] == FREE]
            heapq.heapify(self._block_heap)
        if len(self._slot_heap) > 2 * self.num_state_slots + 64:
            self._slot_heap = sorted({s for s in self._slot_heap if self._slot_free[s] == self.rows_per_state})
