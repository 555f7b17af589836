"""Every op rejects malformed arguments with an error naming the op, the argument, expected and got."""
import pytest
import torch

from dsahal import ops

I32 = torch.int32


def latent_pages(num_blocks=2, block_tokens=4, token_bytes=1152):
    return torch.zeros(num_blocks, block_tokens, token_bytes, dtype=torch.uint8)


def index_pages(num_blocks=2, block_tokens=4, token_bytes=132):
    return torch.zeros(num_blocks, block_tokens, token_bytes, dtype=torch.uint8)


def indexer_args(**over):
    args = dict(q=torch.randn(3, 2, 128), weights=torch.rand(3, 2), index_pages=index_pages(),
                block_table=torch.tensor([[0, 1]], dtype=I32), req_ids=torch.zeros(3, dtype=I32),
                positions=torch.tensor([0, 1, 7], dtype=I32), index_fmt="fp8", max_context=8)
    args.update(over)
    return args


def call_indexer(**over):
    a = indexer_args(**over)
    return ops.indexer_score(a["q"], a["weights"], a["index_pages"], a["block_table"], a["req_ids"], a["positions"],
                             index_fmt=a["index_fmt"], max_context=a["max_context"])


def call_mla(**over):
    a = dict(q=torch.randn(2, 3, 576), kv_pages=latent_pages(), slots=torch.tensor([[0, 5], [-1, 7]], dtype=I32),
             kv_fmt="bf16", softmax_scale=0.1, kv_scale=None)
    a.update(over)
    return ops.sparse_mla(a["q"], a["kv_pages"], a["slots"], kv_fmt=a["kv_fmt"], softmax_scale=a["softmax_scale"],
                          kv_scale=a["kv_scale"])


def call_write(**over):
    a = dict(values=torch.randn(2, 576), slots=torch.tensor([0, 3]), pages=latent_pages(), kind="latent",
             fmt="bf16", scale=None)
    a.update(over)
    return ops.cache_write(a["values"], a["slots"], a["pages"], kind=a["kind"], fmt=a["fmt"], scale=a["scale"])


def call_topk(**over):
    a = dict(scores=torch.randn(2, 10), lengths=torch.tensor([10, 4], dtype=I32), k=3)
    a.update(over)
    return ops.topk(a["scores"], a["lengths"], a["k"])


def kda_args(lead=2, **over):
    a = dict(q=torch.randn(lead, 2, 8), k=torch.randn(lead, 2, 8), v=torch.randn(lead, 2, 4),
             g=-torch.rand(lead, 2, 8), beta=torch.rand(lead, 2), state_pool=torch.zeros(3, 2, 8, 4),
             state_ids=torch.tensor([0, 2], dtype=I32))
    a.update(over)
    return a


def call_kda_decode(**over):
    a = kda_args(**over)
    return ops.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state_pool"], a["state_ids"])


def call_kda_prefill(cu_seqlens=None, **over):
    a = kda_args(lead=5, **over)
    cu = torch.tensor([0, 2, 5], dtype=I32) if cu_seqlens is None else cu_seqlens
    return ops.kda_prefill(a["q"], a["k"], a["v"], a["g"], a["beta"], cu, a["state_pool"], a["state_ids"])


CASES = [
    # (id, call, error type, fragments the message must contain)
    ("indexer-q-dim", lambda: call_indexer(q=torch.randn(3, 2, 64)), ValueError,
     ["dsahal.indexer_score", "'q'", "[T, H, 128]", "[3, 2, 64]"]),
    ("indexer-q-dtype", lambda: call_indexer(q=torch.randn(3, 2, 128).double()), TypeError,
     ["'q'", "float64"]),
    ("indexer-weights-heads", lambda: call_indexer(weights=torch.rand(3, 5)), ValueError,
     ["'weights'", "H=2 from 'q' dim 1"]),
    ("indexer-pages-bytes", lambda: call_indexer(index_pages=index_pages(token_bytes=256)), ValueError,
     ["'index_pages'", "132", "256"]),
    ("indexer-format", lambda: call_indexer(index_fmt="fp4"), ValueError, ["'index_fmt'", "fp4", "fp8"]),
    ("indexer-pages-dtype", lambda: call_indexer(index_pages=index_pages().float()), TypeError, ["uint8"]),
    ("indexer-position-beyond-table", lambda: call_indexer(positions=torch.tensor([0, 1, 8], dtype=I32)),
     ValueError, ["'positions'", "[0, 7]", "got 8"]),
    ("indexer-req-out-of-range", lambda: call_indexer(req_ids=torch.tensor([0, 1, 0], dtype=I32)), ValueError,
     ["'req_ids'", "got 1"]),
    ("indexer-block-out-of-range", lambda: call_indexer(block_table=torch.tensor([[0, 2]], dtype=I32)), ValueError,
     ["'block_table'", "got 2"]),
    ("indexer-max-context", lambda: call_indexer(max_context=0), ValueError, ["'max_context'", ">= 1"]),
    ("indexer-not-a-tensor", lambda: call_indexer(weights=[[1.0, 2.0]]), TypeError, ["'weights'", "list"]),
    ("mla-q-dim", lambda: call_mla(q=torch.randn(2, 3, 512)), ValueError, ["dsahal.sparse_mla", "[T, H, 576]"]),
    ("mla-slots-rows", lambda: call_mla(slots=torch.zeros(3, 2, dtype=I32)), ValueError, ["'slots'", "T=2"]),
    ("mla-slot-out-of-range", lambda: call_mla(slots=torch.tensor([[0, 8], [1, 2]], dtype=I32)), ValueError,
     ["'slots'", "[-1, 7]", "got 8"]),
    ("mla-slots-float", lambda: call_mla(slots=torch.zeros(2, 2)), TypeError, ["'slots'", "int32 or int64"]),
    ("mla-fp8-needs-scale", lambda: call_mla(kv_pages=latent_pages(token_bytes=576), kv_fmt="fp8"), TypeError,
     ["'kv_scale'", "None"]),
    ("mla-bf16-rejects-scale", lambda: call_mla(kv_scale=torch.tensor(1.0)), ValueError, ["'kv_scale'"]),
    ("mla-scale-positive", lambda: call_mla(softmax_scale=0.0), ValueError, ["'softmax_scale'", "> 0"]),
    ("mla-scale-type", lambda: call_mla(softmax_scale="0.1"), TypeError, ["'softmax_scale'"]),
    ("write-dim", lambda: call_write(values=torch.randn(2, 128)), ValueError, ["dsahal.cache_write", "'values'"]),
    ("write-kind", lambda: call_write(kind="value"), ValueError, ["'kind'", "'latent'"]),
    ("write-slot-out-of-range", lambda: call_write(slots=torch.tensor([0, 8])), ValueError, ["'slots'", "got 8"]),
    ("write-slot-below-minus-one", lambda: call_write(slots=torch.tensor([-2, 1])), ValueError, ["got -2"]),
    ("write-duplicate-slots", lambda: call_write(slots=torch.tensor([3, 3])), ValueError, ["written twice"]),
    ("write-slots-count", lambda: call_write(slots=torch.tensor([0, 1, 2])), ValueError, ["'slots'", "N=2"]),
    ("write-noncontiguous-bytes", lambda: call_write(pages=torch.zeros(2, 4, 2304, dtype=torch.uint8)[..., ::2]),
     ValueError, ["'pages'", "unit stride"]),
    ("topk-k", lambda: call_topk(k=0), ValueError, ["dsahal.topk", "'k'"]),
    ("topk-k-type", lambda: call_topk(k=2.0), TypeError, ["'k'", "int"]),
    ("topk-lengths-too-long", lambda: call_topk(lengths=torch.tensor([11, 4], dtype=I32)), ValueError,
     ["'lengths'", "got 11"]),
    ("topk-scores-dtype", lambda: call_topk(scores=torch.randn(2, 10).half()), TypeError, ["'scores'", "float32"]),
    ("topk-lengths-rows", lambda: call_topk(lengths=torch.tensor([1], dtype=I32)), ValueError, ["T=2"]),
    ("lse-shapes", lambda: ops.lse_combine(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5)), ValueError,
     ["dsahal.lse_combine", "'lse_parts'"]),
    ("lse-dtype", lambda: ops.lse_combine(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4).double()), TypeError,
     ["'lse_parts'", "float32"]),
    ("kda-decode-v-heads", lambda: call_kda_decode(v=torch.randn(2, 3, 4)), ValueError,
     ["dsahal.kda_decode", "'v'"]),
    ("kda-decode-state-dtype", lambda: call_kda_decode(state_pool=torch.zeros(3, 2, 8, 4).half()), TypeError,
     ["'state_pool'", "float32"]),
    ("kda-decode-state-shape", lambda: call_kda_decode(state_pool=torch.zeros(3, 2, 4, 8)), ValueError,
     ["'state_pool'", "K=8"]),
    ("kda-decode-state-id-range", lambda: call_kda_decode(state_ids=torch.tensor([0, 3], dtype=I32)), ValueError,
     ["'state_ids'", "got 3"]),
    ("kda-decode-shared-state", lambda: call_kda_decode(state_ids=torch.tensor([1, 1], dtype=I32)), ValueError,
     ["used twice"]),
    ("kda-prefill-cu-end", lambda: call_kda_prefill(cu_seqlens=torch.tensor([0, 2, 4], dtype=I32)), ValueError,
     ["dsahal.kda_prefill", "'cu_seqlens'", "T=5"]),
    ("kda-prefill-cu-count", lambda: call_kda_prefill(cu_seqlens=torch.tensor([0, 5], dtype=I32)), ValueError,
     ["'cu_seqlens'"]),
    ("kda-prefill-cu-decreasing", lambda: call_kda_prefill(cu_seqlens=torch.tensor([0, 4, 3], dtype=I32)),
     ValueError, ["non-decreasing"]),
    ("slots-block-tokens", lambda: ops.positions_to_slots(torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32),
                                                          torch.zeros(1, 2, dtype=I32), 0), ValueError,
     ["dsahal.positions_to_slots", "'block_tokens'"]),
    ("merge-k", lambda: ops.topk_merge(torch.randn(2, 4), torch.tensor([4, 4], dtype=I32), -1), ValueError,
     ["dsahal.topk_merge", "'k'"]),
    ("all-to-all-splits", lambda: ops.all_to_all(torch.randn(4, 2), [4], [3]), ValueError,
     ["dsahal.all_to_all", "'input_split_sizes'"]),
    ("all-gather-type", lambda: ops.all_gather([1, 2]), TypeError, ["dsahal.all_gather", "'x'"]),
    ("dsa-block-mismatch", lambda: ops.dsa_attention(
        torch.randn(3, 2, 128), torch.rand(3, 2), index_pages(), torch.randn(3, 4, 576),
        latent_pages(num_blocks=3), torch.tensor([[0, 1]], dtype=I32), torch.zeros(3, dtype=I32),
        torch.tensor([0, 1, 7], dtype=I32), index_fmt="fp8", kv_fmt="bf16", topk=4, max_context=8,
        softmax_scale=0.1), ValueError, ["dsahal.dsa_attention", "'kv_pages'"]),
]


@pytest.mark.parametrize("call,error,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_raises_a_message_naming_it(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"


def test_rejected_cache_write_leaves_the_cache_untouched():
    pages = torch.randint(0, 256, (2, 4, 1152), dtype=torch.uint8)
    before = pages.clone()
    with pytest.raises(ValueError):
        ops.cache_write(torch.randn(2, 576), torch.tensor([1, 9]), pages, kind="latent", fmt="bf16")
    assert torch.equal(pages, before)


def test_check_false_skips_validation_for_hot_paths():
    scores = torch.randn(2, 10)
    # A float64 score matrix is rejected when checked but the caller may take responsibility.
    with pytest.raises(TypeError):
        ops.topk(scores.double(), torch.tensor([10, 4]), 3)
    assert ops.topk(scores, torch.tensor([10, 4]), 3, check=False).shape == (2, 3)
