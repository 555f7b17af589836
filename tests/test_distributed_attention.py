"""DCP decode attention and token-sharded prefill on one rank (no process group), and their input checks.
The multi-rank versions run in test_distributed_gloo.py."""
import pytest
import torch

from dsahal import ops
from dsahal.distributed import dcp_dsa_attention, token_sharded_dsa_prefill

from test_distributed_gloo import INDEX_FMT, KV_FMT, SOFTMAX_SCALE, attention_inputs


@pytest.fixture
def decode_batch():
    context_lens = torch.tensor([21, 9])
    req_ids = torch.tensor([0, 0, 1], dtype=torch.int32)
    positions = torch.tensor([19, 20, 8], dtype=torch.int32)
    return context_lens, req_ids, positions, attention_inputs(5, context_lens, 4, req_ids, heads=2)


def test_one_rank_dcp_attention_is_dsa_attention(decode_batch):
    _, req_ids, positions, x = decode_batch
    k, max_context = 8, 24
    got_o, got_lse = dcp_dsa_attention(x["q_index"], x["index_weights"], x["index_pages"], x["q"], x["kv_pages"],
                                       x["block_table"], req_ids, positions, index_fmt=INDEX_FMT, kv_fmt=KV_FMT,
                                       topk=k, max_context=max_context, softmax_scale=SOFTMAX_SCALE)
    scores = ops.indexer_score(x["q_index"], x["index_weights"], x["index_pages"], x["block_table"], req_ids,
                               positions, index_fmt=INDEX_FMT, max_context=max_context)
    chosen = ops.topk(scores, positions + 1, k)
    slots = ops.positions_to_slots(chosen, req_ids, x["block_table"], 4)
    o, lse = ops.sparse_mla(x["q"], x["kv_pages"], slots, kv_fmt=KV_FMT, softmax_scale=SOFTMAX_SCALE)
    torch.testing.assert_close(got_o, o, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_lse, lse, rtol=1e-6, atol=1e-7)


def test_dcp_attention_rejects_a_query_of_the_wrong_width(decode_batch):
    _, req_ids, positions, x = decode_batch
    with pytest.raises(ValueError, match=r"dsahal.dsa_attention: argument 'q' expected .*576"):
        dcp_dsa_attention(x["q_index"], x["index_weights"], x["index_pages"], x["q"][..., :512], x["kv_pages"],
                          x["block_table"], req_ids, positions, index_fmt=INDEX_FMT, kv_fmt=KV_FMT, topk=8,
                          max_context=24, softmax_scale=SOFTMAX_SCALE)


def test_dcp_attention_rejects_a_non_positive_max_context(decode_batch):
    _, req_ids, positions, x = decode_batch
    with pytest.raises(ValueError, match="dcp_dsa_attention: argument 'max_context' expected an int >= 1, got 0"):
        dcp_dsa_attention(x["q_index"], x["index_weights"], x["index_pages"], x["q"], x["kv_pages"],
                          x["block_table"], req_ids, positions, index_fmt=INDEX_FMT, kv_fmt=KV_FMT, topk=8,
                          max_context=0, softmax_scale=SOFTMAX_SCALE)


def test_one_rank_token_sharded_prefill_is_dsa_attention(decode_batch):
    _, req_ids, positions, x = decode_batch
    common = dict(index_fmt=INDEX_FMT, kv_fmt=KV_FMT, topk=8, max_context=24, softmax_scale=SOFTMAX_SCALE)
    args = (x["q_index"], x["index_weights"], x["index_pages"], x["q"], x["kv_pages"], x["block_table"], req_ids,
            positions)
    o = token_sharded_dsa_prefill(*args, **common)
    expected, _ = ops.dsa_attention(*args, **common)
    assert torch.equal(o, expected)
