"""positions_to_slots: exact translation through the block table; -1 for padding and unmapped blocks."""
from __future__ import annotations

import torch
from hypothesis import given

from dsahal import ops
from dsahal.conformance import assertions as A
from dsahal.conformance.badinput import check_rejections
from dsahal.conformance.harness import conformance_property
from dsahal.conformance.strategies import slots_cases


def _call(a):
    return ops.positions_to_slots(a.positions, a.req_ids, a.block_table, a.block_tokens)


@conformance_property("positions_to_slots", "positions_to_slots.matches_reference")
@given(case=slots_cases())
def test_positions_to_slots_matches_reference_exactly(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    got = conformance.call(lambda: _call(a))
    expected = conformance.table.reference["positions_to_slots"](a.positions, a.req_ids, a.block_table,
                                                                a.block_tokens)
    A.assert_shape_dtype(conformance, "slots", got, a.positions.shape, (torch.int32,))
    A.assert_equal(conformance, "slots", got, expected)


@conformance_property("positions_to_slots", "positions_to_slots.rejects_bad_input", scale=0.2)
@given(case=slots_cases())
def test_positions_to_slots_rejects_bad_input(case, conformance):
    conformance.begin(case)
    a = conformance.build(case)
    conformance.call(lambda: _call(a))
    beyond = a.positions.clone()
    beyond[0, 0] = a.block_table.shape[1] * a.block_tokens
    bad_req = a.req_ids.clone()
    bad_req[0] = a.block_table.shape[0]
    check_rejections(conformance, "positions_to_slots", {
        "positions float": (lambda: ops.positions_to_slots(a.positions.float(), a.req_ids, a.block_table,
                                                           a.block_tokens), TypeError),
        "position beyond the block table": (lambda: ops.positions_to_slots(beyond, a.req_ids, a.block_table,
                                                                           a.block_tokens), ValueError),
        "request id beyond the block table": (lambda: ops.positions_to_slots(a.positions, bad_req, a.block_table,
                                                                             a.block_tokens), ValueError),
        "req_ids of another length": (lambda: ops.positions_to_slots(a.positions, torch.cat([a.req_ids, a.req_ids]),
                                                                     a.block_table, a.block_tokens), ValueError),
        "block_tokens = 0": (lambda: ops.positions_to_slots(a.positions, a.req_ids, a.block_table, 0), ValueError),
    })
