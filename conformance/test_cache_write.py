"""cache_write: every format, write then read within the format's error bound, nothing written outside
the target slots (guard bytes, guard blocks, other slots, skipped tokens, and in the packed cache the
other layers' pages around the target page), documented errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.paged import CacheWriteCase
from dsahal.conformance.strategies import all_format_ids, bind, cache_write_cases

FORMATS = all_format_ids()
# Adjacent slots of one block, a skipped token, guard bytes and blocks around the pages.
NEIGHBOURS = CacheWriteCase(kind=None, fmt=None, tokens=6, num_blocks=2, block_tokens=4, skip_fraction=0.3,
                            dtype="float32", regime="limit", lead=3, trail=5, guard_blocks=1, seed=8)
# Every slot of two blocks of the packed cache (each block's first and last slot: the block edges),
# through int64 slots: a write addressed as if the pages were contiguous lands in another layer.
PACKED_EDGES = CacheWriteCase(kind=None, fmt=None, tokens=8, num_blocks=2, block_tokens=4, skip_fraction=0.0,
                              dtype="float32", regime="normal", lead=0, trail=0, guard_blocks=0, seed=11,
                              layout="packed", index_dtype="int64")


def _write(a, slots=None, values=None, scale="same"):
    ops.cache_write(a.values if values is None else values, a.slots if slots is None else slots, a.pages,
                    kind=a.kind, fmt=a.fmt, scale=a.scale if scale == "same" else scale)


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("cache_write", "cache_write.read_back_within_bound")
@given(case=cache_write_cases())
@example(case=NEIGHBOURS)
@example(case=PACKED_EDGES)
def test_cache_write_then_read_is_within_the_format_bound(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: _write(a))
    keep = a.slots >= 0
    slots = a.slots[keep].long()
    records = a.pages[slots // a.pages.shape[1], slots % a.pages.shape[1]].cpu()
    values = a.values[keep].float().cpu()
    scale = None if a.scale is None else a.scale.cpu()
    read = a.spec.unpack(records, scale)
    A.assert_no_nan(conformance, "read back", read)
    bound = a.spec.error_bound(values, scale)
    err = (read - values).abs()
    if bool((err > bound).any()):
        token, dim = (int(i) for i in (err > bound).nonzero()[0])
        conformance.fail(f"token written to slot {int(slots[token])} reads back {float(read[token, dim])!r} at dim "
                         f"{dim} for input {float(values[token, dim])!r}: error {float(err[token, dim]):.3e} > "
                         f"format bound {float(bound[token, dim]):.3e} ({int((err > bound).sum())} elements)")


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("cache_write", "cache_write.no_write_outside_slots")
@given(case=cache_write_cases())
@example(case=NEIGHBOURS)
@example(case=PACKED_EDGES)
def test_cache_write_touches_nothing_outside_its_target_slots(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    before = a.guarded.pool.cpu().clone()  # .cpu() alone aliases a CPU tensor
    conformance.call(lambda: _write(a))
    outside = ~a.guarded.record_mask(a.slots.cpu())
    changed = (a.guarded.pool.cpu() != before) & outside
    if bool(changed.any()):
        where = a.guarded.describe(tuple(int(i) for i in changed.nonzero()[0]))
        where += ", which is not a target" if where.startswith("slot") else ""
        conformance.fail(f"wrote outside the target slots {sorted(a.slots[a.slots >= 0].tolist())}: first changed "
                         f"byte is in {where} ({int(changed.sum())} bytes changed outside)")


@pytest.mark.parametrize("fmt", FORMATS)
@conformance_property("cache_write", "cache_write.rejects_bad_input", scale=0.2)
@given(case=cache_write_cases())
def test_cache_write_rejects_bad_input_and_writes_nothing(fmt, case, conformance):
    case = bind(case, fmt)
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: _write(a))
    num_slots = a.pages.shape[0] * a.pages.shape[1]
    snapshot = a.guarded.pool.clone()
    beyond = a.slots.clone()
    beyond[-1] = num_slots
    valid = a.slots[a.slots >= 0]
    repeated = int(valid[0]) if valid.numel() else 0
    twice = torch.cat([a.slots, torch.tensor([repeated, repeated], dtype=a.slots.dtype, device=a.slots.device)])
    wrong_scale = None if a.spec.needs_tensor_scale else torch.tensor(1.0, device=a.values.device)

    def unchanged(name):
        if not torch.equal(a.guarded.pool, snapshot):
            conformance.fail(f"bad input '{name}' was rejected but bytes of the cache changed")

    check_rejections(conformance, "cache_write", {
        "slot beyond the pages": (lambda: _write(a, slots=beyond), ValueError),
        "slot written twice": (lambda: _write(a, slots=twice,
                                              values=torch.cat([a.values, a.values[:1], a.values[:1]])), ValueError),
        "values of another dim": (lambda: _write(a, values=a.values[:, 1:]), ValueError),
        "values int": (lambda: _write(a, values=a.values.int()), TypeError),
        "slots float": (lambda: _write(a, slots=a.slots.float()), TypeError),
        "scale missing or superfluous": (lambda: _write(a, scale=wrong_scale), (TypeError, ValueError)),
        "unknown format": (lambda: ops.cache_write(a.values, a.slots, a.pages, kind=a.kind, fmt="no-such-format",
                                                   scale=a.scale), ValueError),
    }, after_each=unchanged)
