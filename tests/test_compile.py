"""The ops are torch custom ops: a graph calling them traces with torch.compile(fullgraph=True)."""
import torch

from dsahal import ops


def test_attention_ops_compile_without_graph_breaks_and_match_eager():
    torch.manual_seed(0)
    index_pages = torch.zeros(4, 8, 132, dtype=torch.uint8)
    kv_pages = torch.zeros(4, 8, 1152, dtype=torch.uint8)
    ops.cache_write(torch.randn(32, 128), torch.arange(32), index_pages, kind="index", fmt="fp8")
    ops.cache_write(torch.randn(32, 576), torch.arange(32), kv_pages, kind="latent", fmt="bf16")
    block_table = torch.tensor([[1, 3, 0, 2]], dtype=torch.int32)
    req_ids = torch.zeros(2, dtype=torch.int32)
    positions = torch.tensor([17, 30], dtype=torch.int32)

    def layer(q_index, weights, q, o_parts, lse_parts):
        o, lse = ops.dsa_attention(q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                                   index_fmt="fp8", kv_fmt="bf16", topk=8, max_context=32, softmax_scale=0.1,
                                   check=False)
        merged, _ = ops.lse_combine(torch.cat([o[None], o_parts]), torch.cat([lse[None], lse_parts]), check=False)
        return merged

    args = (torch.randn(2, 2, 128), torch.rand(2, 2), torch.randn(2, 4, 576), torch.randn(1, 2, 4, 512),
            torch.randn(1, 2, 4))
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), layer(*args))


def test_kda_state_mutation_is_visible_after_compiled_call():
    pool = torch.zeros(2, 2, 8, 4)
    q, k, v = torch.randn(1, 2, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 4)
    g, beta = -torch.rand(1, 2, 8), torch.rand(1, 2)
    ids = torch.tensor([1], dtype=torch.int32)

    def step(q, k, v, g, beta):
        return ops.kda_decode(q, k, v, g, beta, pool, ids, check=False)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    compiled(q, k, v, g, beta)
    assert torch.count_nonzero(pool[1]) > 0 and torch.count_nonzero(pool[0]) == 0


def test_validated_in_place_ops_compile_without_graph_breaks():
    # check=True runs the validators inside the compiled region; the in-place check's is_inference() is not
    # traceable (it broke fullgraph compiles of kda_decode and cache_write with check=True)
    torch.manual_seed(1)
    pool = torch.randn(3, 2, 8, 4) * 0.1
    pages = torch.randint(0, 256, (2, 8, 132), dtype=torch.uint8)
    q, k, v = torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 4)
    g, beta = -torch.rand(2, 2, 8), torch.rand(2, 2)
    ids = torch.tensor([2, 0], dtype=torch.int32)
    keys, slots = torch.randn(3, 128), torch.tensor([5, 9, 14])

    def step(q, k, v, g, beta, pool, pages):
        ops.cache_write(keys, slots, pages, kind="index", fmt="fp8")
        return ops.kda_decode(q, k, v, g, beta, pool, ids)

    eager_pool, eager_pages = pool.clone(), pages.clone()
    expected = step(q, k, v, g, beta, eager_pool, eager_pages)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v, g, beta, pool, pages), expected)
    assert torch.equal(pool, eager_pool) and torch.equal(pages, eager_pages)
