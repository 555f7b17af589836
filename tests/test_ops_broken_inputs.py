"""Broken inputs that used to crash inside an op, pass silently, or fail without naming the op.

Each case was found by probing the public ops on the reference backend: a raw ``AttributeError`` /
``ZeroDivisionError`` / ``RuntimeError`` from deep inside, an allocation failure, or a wrong value accepted
(``float()`` applied before the check). Each must now raise the documented error type with a message that
starts ``dsahal.<op>:`` and names the argument; where the op writes in place, nothing is written.
"""
import re

import numpy as np
import pytest
import torch

from dsahal import ops

I32 = torch.int32
U8 = torch.uint8
META = torch.device("meta")


def rejects(call, error, op, arg, *fragments):
    """``call()`` raises exactly ``error`` with a message that names the op first, then the argument (a raw
    TypeError from ``float()`` or ``len()`` has the right type but names neither)."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert type(info.value) is error, message
    assert message.startswith(f"dsahal.{op}: "), f"the op is not named first: {message}"
    assert re.search(rf"\b{re.escape(arg)}\b", message), f"argument {arg!r} not named: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    return message


def pages(blocks=2, block_tokens=4, token_bytes=1152, device=None):
    return torch.zeros(blocks, block_tokens, token_bytes, dtype=U8, device=device)


def kda_args(lead, device=None, **over):
    a = dict(q=torch.randn(lead, 2, 8), k=torch.randn(lead, 2, 8), v=torch.randn(lead, 2, 4),
             g=-torch.rand(lead, 2, 8), beta=torch.rand(lead, 2), state_pool=torch.randn(3, 2, 8, 4),
             state_ids=torch.tensor([0, 2], dtype=I32), cu_seqlens=torch.tensor([0, 2, lead], dtype=I32))
    if device is not None:
        a = {name: t.to(device) for name, t in a.items()}
    a.update(over)
    return a


def call_kda(op, scale=None, **over):
    a = kda_args(2 if op == "kda_decode" else 5, **over)
    if op == "kda_decode":
        call = lambda: ops.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state_pool"],  # noqa: E731
                                      a["state_ids"], scale=scale)
    else:
        call = lambda: ops.kda_prefill(a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"],  # noqa: E731
                                       a["state_pool"], a["state_ids"], scale=scale)
    return call, a["state_pool"]


def dsa_args(device=None, **over):
    a = dict(q_index=torch.randn(3, 2, 128), index_weights=torch.rand(3, 2), index_pages=pages(token_bytes=132),
             q=torch.randn(3, 4, 576), kv_pages=pages(), block_table=torch.tensor([[0, 1]], dtype=I32),
             req_ids=torch.zeros(3, dtype=I32), positions=torch.tensor([0, 1, 7], dtype=I32))
    if device is not None:
        a = {name: t.to(device) for name, t in a.items()}
    a.update(index_fmt="fp8", kv_fmt="bf16", kv_scale=None, topk=4, max_context=8, softmax_scale=0.1)
    a.update(over)
    return a


KDA_OPS = ["kda_decode", "kda_prefill"]
NOT_A_FLOAT = {"tensor": torch.tensor(0.1), "bool": True, "str": "0.1"}


# ---------------------------------------------------------------------------- scales checked as given

@pytest.mark.parametrize("value", list(NOT_A_FLOAT.values()) + [None, [0.1], np.float32(0.1)],
                         ids=list(NOT_A_FLOAT) + ["None", "list", "np.float32"])
def test_dsa_attention_checks_softmax_scale_before_converting_it(value):
    # float() ran first: a tensor, True, "0.1" and np.float32 were accepted (sparse_mla rejects each), None raised
    # float()'s own TypeError
    rejects(lambda: ops.dsa_attention(**dsa_args(softmax_scale=value)), TypeError, "dsa_attention", "softmax_scale",
            "expected a float", f"got {type(value).__name__}")


@pytest.mark.parametrize("op", KDA_OPS)
@pytest.mark.parametrize("kind", NOT_A_FLOAT)
def test_kda_checks_scale_before_converting_it_and_writes_no_state(op, kind):
    call, pool = call_kda(op, scale=NOT_A_FLOAT[kind])
    before = pool.clone()
    rejects(call, TypeError, op, "scale", "expected a float", f"got {type(NOT_A_FLOAT[kind]).__name__}")
    assert torch.equal(pool, before)


@pytest.mark.parametrize("op", KDA_OPS)
@pytest.mark.parametrize("q,error,fragment", [(None, TypeError, "got None"), ([1.0], TypeError, "got list"),
                                              (torch.tensor(1.0), ValueError, "got shape []")],
                         ids=["None", "list", "0-d"])
def test_kda_names_a_malformed_q_instead_of_failing_on_its_shape(op, q, error, fragment):
    # the default scale read q.shape[-1] before validation: AttributeError / IndexError
    rejects(call_kda(op, q=q)[0], error, op, "q", fragment)


@pytest.mark.parametrize("op", KDA_OPS)
def test_kda_with_no_key_dim_and_the_default_scale_is_rejected(op):
    # 0.0 ** -0.5: ZeroDivisionError
    lead = 2 if op == "kda_decode" else 5
    empty = dict(q=torch.randn(lead, 2, 0), k=torch.randn(lead, 2, 0), g=torch.zeros(lead, 2, 0),
                 state_pool=torch.zeros(3, 2, 0, 4))
    rejects(call_kda(op, **empty)[0], ValueError, op, "q", "K >= 1", "K=0")


@pytest.mark.parametrize("op,arg", [("sparse_mla", "softmax_scale"), ("dsa_attention", "softmax_scale"),
                                    ("kda_decode", "scale"), ("kda_prefill", "scale")])
@pytest.mark.parametrize("value", [1e39, 1e300], ids=["1e39", "1e300"])
def test_a_scalar_scale_past_fp32_is_rejected(op, arg, value):
    # a finite Python float accepted as "finite", which every kernel takes as an fp32: inf there (the reference's
    # float64 KDA output became inf in q's dtype, kda_decode and kda_prefill wrote the state all the same)
    if op == "sparse_mla":
        call = lambda: ops.sparse_mla(torch.randn(2, 3, 576), pages(), torch.tensor([[0, 5], [1, -1]], dtype=I32),  # noqa: E731
                                      kv_fmt="bf16", softmax_scale=value)
        pool = None
    elif op == "dsa_attention":
        call, pool = (lambda: ops.dsa_attention(**dsa_args(softmax_scale=value))), None
    else:
        call, pool = call_kda(op, scale=value)
    before = None if pool is None else pool.clone()
    rejects(call, ValueError, op, arg, "at most 3.4028235e+38", f"got {value}")
    if pool is not None:
        assert torch.equal(pool, before)


# ---------------------------------------------------------------------------- arguments written in place

@pytest.mark.parametrize("op", KDA_OPS)
def test_a_state_pool_that_requires_grad_is_rejected_while_autograd_records(op):
    # the reference's in-place write raised autograd's own RuntimeError ("a leaf Variable that requires grad is
    # being used in an in-place operation"); a kernel writing through the pointer would have bypassed autograd
    pool = torch.nn.Parameter(torch.randn(3, 2, 8, 4))
    call, _ = call_kda(op, state_pool=pool)
    before = pool.detach().clone()
    rejects(call, ValueError, op, "state_pool", "does not require grad", "requires_grad=True")
    assert torch.equal(pool.detach(), before)
    with torch.no_grad():  # nothing records: the write is the caller's to make
        call()
    assert not torch.equal(pool.detach(), before)


def inference_pages():
    with torch.inference_mode():
        return torch.randint(0, 256, (2, 4, 1152), dtype=U8)


def test_cache_write_rejects_inference_pages_outside_inference_mode():
    # the reference's scatter raised torch's RuntimeError ("Inplace update to inference tensor outside
    # InferenceMode is not allowed"); a kernel would have written it
    target = inference_pages()
    before = target.clone()
    values, slots = torch.randn(2, 576), torch.tensor([5, 0], dtype=I32)
    rejects(lambda: ops.cache_write(values, slots, target, kind="latent", fmt="bf16"), ValueError, "cache_write",
            "pages", "inference tensor", "inference_mode")
    assert torch.equal(target, before)
    with torch.inference_mode():
        ops.cache_write(values, slots, target, kind="latent", fmt="bf16")
    assert not torch.equal(target[1, 1], before[1, 1]) and torch.equal(target[0, 1:], before[0, 1:])


@pytest.mark.parametrize("op", KDA_OPS)
def test_an_inference_state_pool_is_rejected_outside_inference_mode(op):
    with torch.inference_mode():
        pool = torch.randn(3, 2, 8, 4)
    call, _ = call_kda(op, state_pool=pool)
    before = pool.clone()
    rejects(call, ValueError, op, "state_pool", "inference tensor")
    assert torch.equal(pool, before)


# ---------------------------------------------------------------------------- devices

def test_kda_prefill_checks_the_device_of_cu_seqlens():
    # it was left out of the device check: read by the reference as .tolist() (NotImplementedError on meta), and a
    # host cu_seqlens would reach a GPU kernel as a host pointer
    call, pool = call_kda("kda_prefill", cu_seqlens=torch.tensor([0, 2, 5], dtype=I32, device=META))
    before = pool.clone()
    rejects(call, ValueError, "kda_prefill", "cu_seqlens", "one device", "cu_seqlens on meta")
    assert torch.equal(pool, before)


def meta_calls():
    """Every op whose result depends on values it reads, called with all of its tensors on the meta device."""
    def write():
        ops.cache_write(torch.randn(2, 576, device=META), torch.zeros(2, dtype=I32, device=META), pages(device=META),
                        kind="latent", fmt="bf16")

    def indexer():
        a = dsa_args(META)
        ops.indexer_score(a["q_index"], a["index_weights"], a["index_pages"], a["block_table"], a["req_ids"],
                          a["positions"], index_fmt="fp8", max_context=8)

    def mla():
        ops.sparse_mla(torch.randn(2, 3, 576, device=META), pages(device=META), torch.zeros(2, 2, dtype=I32, device=META),
                       kv_fmt="bf16", softmax_scale=0.1)

    def kda(op):
        a = kda_args(2 if op == "kda_decode" else 5, device=META)
        if op == "kda_decode":
            return lambda: ops.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state_pool"], a["state_ids"])
        return lambda: ops.kda_prefill(a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"], a["state_pool"],
                                       a["state_ids"])

    return {"cache_write": (write, "slots"), "indexer_score": (indexer, "positions"), "sparse_mla": (mla, "q"),
            "kda_decode": (kda("kda_decode"), "q"), "kda_prefill": (kda("kda_prefill"), "q"),
            "dsa_attention": (lambda: ops.dsa_attention(**dsa_args(META)), "positions")}


@pytest.mark.parametrize("op", list(meta_calls()))
def test_an_op_that_reads_values_rejects_meta_tensors_by_name(op):
    # the reference failed deep inside: "Tensor.item() cannot be called on meta tensors" (RuntimeError),
    # torch.nonzero's NotImplementedError for sparse_mla
    call, arg = meta_calls()[op]
    rejects(call, ValueError, op, arg, "expected a tensor with data", "meta device")


# ---------------------------------------------------------------------------- counts and empty tables

@pytest.mark.parametrize("op", ["topk", "topk_merge"])
def test_a_k_past_int32_is_rejected_before_any_allocation(op):
    # the reference allocated [T, k] and failed in the CPU allocator (RuntimeError); dsa_attention bounds its topk
    fn = ops.topk if op == "topk" else ops.topk_merge
    rejects(lambda: fn(torch.randn(1, 4), torch.tensor([4], dtype=I32), 2**40), ValueError, op, "k",
            "at most 2147483647", f"got {2**40}")


def test_positions_to_slots_rejects_a_block_table_of_no_blocks():
    # positions all -1 passed the range check ([-1, -1]); the reference gathered column 0 of an empty row
    rejects(lambda: ops.positions_to_slots(torch.full((2, 2), -1, dtype=I32), torch.zeros(2, dtype=I32),
                                           torch.zeros(1, 0, dtype=I32), 4),
            ValueError, "positions_to_slots", "block_table", "at least one block", "[1, 0]")


# ---------------------------------------------------------------------------- split sizes

@pytest.mark.parametrize("arg,output,inputs", [
    ("input_split_sizes", 4, 4),  # not a sequence: len() raised its own TypeError
    ("output_split_sizes", [4.5], [4]),  # int(4.5) == 4: silently accepted
    ("input_split_sizes", ["4"], ["4"]),  # sum() of strings: raw TypeError
    ("output_split_sizes", [None], [4]),  # int(None): raw TypeError
    ("input_split_sizes", [True], [True]),  # bools counted as rows
], ids=["int", "float", "str", "None", "bool"])
def test_all_to_all_split_sizes_must_be_ints(arg, output, inputs):
    x = torch.randn(1 if inputs == [True] else 4, 2)
    rejects(lambda: ops.all_to_all(x, output, inputs), TypeError, "all_to_all", arg, "sequence of 1 ints")
    # integer types that are ints are still sizes
    assert torch.equal(ops.all_to_all(torch.arange(4.0), [np.int64(4)], torch.tensor([4])), torch.arange(4.0))


# ---------------------------------------------------------------------------- a tensor argument given as None

def _none_cases():
    """(op, argument, call with that argument None) for every tensor argument of the paged ops."""
    dsa = dsa_args()
    mla = dict(q=torch.randn(3, 4, 576), kv_pages=pages(), slots=torch.zeros(3, 2, dtype=I32))
    idx = {name: dsa[name] for name in ("block_table", "req_ids", "positions")}
    idx.update(q=dsa["q_index"], weights=dsa["index_weights"], index_pages=dsa["index_pages"])
    cases = []
    for name in mla:
        a = dict(mla, **{name: None})
        cases.append(("sparse_mla", name, lambda a=a: ops.sparse_mla(a["q"], a["kv_pages"], a["slots"], kv_fmt="bf16",
                                                                     softmax_scale=0.1)))
    for name in idx:
        a = dict(idx, **{name: None})
        cases.append(("indexer_score", name, lambda a=a: ops.indexer_score(
            a["q"], a["weights"], a["index_pages"], a["block_table"], a["req_ids"], a["positions"], index_fmt="fp8",
            max_context=8)))
    for name in ("q_index", "index_weights", "index_pages", "q", "kv_pages", "block_table", "req_ids", "positions"):
        a = dict(dsa, **{name: None})
        cases.append(("dsa_attention", name, lambda a=a: ops.dsa_attention(**a)))
    return cases


@pytest.mark.parametrize("op,arg,call", _none_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_a_tensor_argument_given_none_is_a_type_error_naming_it(op, arg, call):
    """sparse_mla once passed ``slots=None`` through its checks (None is how the DSA composite's own check skips
    the slots it computes) and failed in a layout helper with an AttributeError."""
    rejects(call, TypeError, op, arg, "got None")
