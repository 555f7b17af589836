"""Device handling: XLA tensors run in place, host tensors are staged (and written back), anything
else is a clear error; every op of the table is native."""
from __future__ import annotations

import pytest
import torch

import dsahal
from dsahal import ops
from dsahal.ops.catalog import OP_NAMES

from conftest import on_reference


def test_every_op_of_the_tpu_table_is_native():
    with dsahal.use_backend("tpu") as table:
        assert {op: table.entries[op].status for op in OP_NAMES} == {op: "native" for op in OP_NAMES}


def test_host_tensors_are_staged_and_results_come_back_to_the_host():
    scores = torch.randn(3, 10)
    lengths = torch.tensor([10, 4, 0], dtype=torch.int32)
    with dsahal.use_backend("tpu"), dsahal.observe(dsahal.CallLog()) as log:
        got = ops.topk(scores, lengths, 3)
    assert [(c.op, c.route, c.fallback) for c in log.calls] == [("topk", "xla", False)]
    assert got.device.type == "cpu"
    assert torch.equal(got.sort(1).values, on_reference(ops.topk, scores, lengths, 3).sort(1).values)


def test_a_staged_in_place_write_lands_in_the_callers_host_view():
    pool = torch.zeros(3, 4, 1152 + 132, dtype=torch.uint8)
    view = pool[:, :, 1152:]
    values, slots = torch.randn(2, 128), torch.tensor([5, -1], dtype=torch.int32)
    with dsahal.use_backend("tpu"):
        ops.cache_write(values, slots, view, kind="index", fmt="fp8")
    expected = torch.zeros_like(pool)
    on_reference(ops.cache_write, values, slots, expected[:, :, 1152:], kind="index", fmt="fp8")
    assert torch.equal(pool, expected)


def test_a_tensor_on_another_device_is_a_clear_error():
    scores = torch.empty(2, 8, device="meta")
    lengths = torch.empty(2, dtype=torch.int32, device="meta")
    # torch.ops routes meta tensors to the fake kernel, so call the backend's implementation itself.
    with dsahal.use_backend("tpu") as table:
        implementation = table.entries["topk"].fn
    with pytest.raises(ValueError, match=r"dsahal\.topk: argument 'scores' expected an XLA tensor .* got device meta"):
        implementation(scores, lengths, 2)


def test_xla_tensors_are_not_copied_back_to_the_host(xla):
    import torch_xla.debug.metrics as met

    scores, lengths = torch.randn(4, 16).to(xla), torch.full((4,), 16, dtype=torch.int32).to(xla)
    transfers = met.metric_data("TransferFromDeviceTime")
    before = int(transfers[0]) if transfers else 0
    with dsahal.use_backend("tpu"):
        got = ops.topk(scores, lengths, 5, check=False)
    after = met.metric_data("TransferFromDeviceTime")
    assert got.device.type == "xla"
    assert (int(after[0]) if after else 0) == before
