"""The AMD backend's Triton path under the Triton interpreter: its routing, its block sizes (gfx942
and gfx950 choices) and the shared kernels, compared with the reference on the CPU.

The interpreter runs the kernels on host tensors, so the device check is lifted in the subprocess;
bf16 arithmetic is wrong under the interpreter (triton#11584), so queries are fp32 there. The same
source runs on a GPU in the H200 verification run (``DSAHAL_AMD_PATHS=triton``).
"""
import os
import subprocess
import sys
import textwrap

INTERPRETED = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["DSAHAL_AMD_PATHS"] = "triton"
    import torch
    import types
    from dsahal.backends.amd import limits, plugin, triton_ops
    from dsahal.backends.amd import routes as amd_routes
    from dsahal.ops.catalog import COMPOSITE_OPS, OP_NAMES
    from dsahal.reference import cache, indexer, kda, lse_combine, slots, sparse_mla, topk
    from dsahal.reference.plugin import reference_backend
    from dsahal.registry import BackendRecord, OpTable

    limits.on_gpu = lambda **tensors: (True, "")  # the interpreter's "device" is the host
    backend = plugin.amd_backend()
    amd_routes.reset(amd_routes.enabled_paths())  # DSAHAL_AMD_PATHS=triton: every vendor path off
    op_table = OpTable(BackendRecord(backend, "amd", True, "interpreter"),
                       BackendRecord(reference_backend(), "reference", True, ""), OP_NAMES, COMPOSITE_OPS,
                       strict=True)
    routed = []

    def serve(op):
        def call(*args):
            route, declined = op_table.choose(op, *args)
            assert route == "triton", (op, declined)  # the registry picks the Triton route of the AMD backend
            routed.append(op)
            return op_table.dispatch[op](*args)
        return call

    routes = types.SimpleNamespace(**{op: serve(op) for op in OP_NAMES})

    torch.manual_seed(0)
    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    o, lse = torch.randn(3, 4, 2, 16), torch.randn(3, 4, 2)
    lse[0, 1] = float("-inf")
    for got, want in zip(routes.lse_combine(o, lse), lse_combine.lse_combine(o, lse)):
        close(got, want)

    table = torch.tensor([[2, 0, -1, 4], [1, 3, 4, 0]], dtype=torch.int32)
    req, pos = torch.tensor([0, 1, 1], dtype=torch.int32), torch.randint(-1, 16, (3, 5)).int()
    assert torch.equal(routes.positions_to_slots(pos, req, table, 4), slots.positions_to_slots(pos, req, table, 4))

    scores, lengths = torch.randint(0, 4, (3, 50)).float(), torch.tensor([50, 10, 0], dtype=torch.int32)
    scores[0, :7] = float("-inf")
    assert torch.equal(routes.topk(scores, lengths, 7).sort(dim=1).values,
                       topk.topk(scores, lengths, 7).sort(dim=1).values)

    keys, where = torch.randn(20, 128), torch.arange(20)
    where[3] = -1  # skipped
    pages, want_pages = torch.zeros(5, 4, 256, dtype=torch.uint8), torch.zeros(5, 4, 256, dtype=torch.uint8)
    routes.cache_write(keys, where, pages, "index", "bf16", None)
    cache.cache_write(keys, where, want_pages, "index", "bf16", None)
    # Values, not bytes: the interpreter's fp32 -> bf16 rounding is not torch's (triton#11584). Its
    # fp32 -> fp8e4nv cast is wrong outright (31.65 -> 16), so fp8 cache writes are checked on a GPU only.
    torch.testing.assert_close(cache.read_tokens(pages, torch.arange(20), "index", "bf16"),
                               cache.read_tokens(want_pages, torch.arange(20), "index", "bf16"), rtol=2**-7, atol=0)

    for fmt, token_bytes in (("bf16", 256), ("fp8", 132)):
        pages = torch.zeros(5, 4, token_bytes, dtype=torch.uint8)
        cache.cache_write(keys, where, pages, "index", fmt, None)
        args = (torch.randn(3, 4, 128), torch.randn(3, 4), pages, table, req, torch.tensor([3, 9, 15]), fmt, 16)
        got, want = routes.indexer_score(*args), indexer.indexer_score(*args)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), fmt
        close(got[torch.isfinite(want)], want[torch.isfinite(want)])

    latent = torch.randn(16, 576)
    for fmt, token_bytes, scale in (("bf16", 1152, None), ("fp8", 576, torch.tensor(0.01))):
        pages = torch.zeros(4, 4, token_bytes, dtype=torch.uint8)
        cache.cache_write(latent, torch.arange(16), pages, "latent", fmt, scale)
        chosen = torch.tensor([[0, 5, -1, 7, 7, 12], [-1] * 6], dtype=torch.int32)
        for gfx, heads in ((None, 16), ("gfx950", 64)):  # gfx942-sized and gfx950-sized tiles
            triton_ops.tile_target = lambda tensor, gfx=gfx: gfx
            args = (torch.randn(2, heads, 576), pages, chosen, fmt, scale, 0.05)
            got, want = routes.sparse_mla(*args), sparse_mla.sparse_mla(*args)
            close(got[0], want[0])
            close(got[1][0], want[1][0])
            assert torch.isneginf(got[1][1]).all(), (fmt, gfx)

    q, k, v, g, beta = torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 6), -torch.rand(3, 2, 8), torch.rand(3, 2)
    pool = torch.randn(4, 2, 8, 6)
    ref_pool, ids = pool.clone(), torch.tensor([2, -1, 0], dtype=torch.int32)
    close(routes.kda_decode(q, k, v, g, beta, pool, ids, 0.3, True), kda.kda_decode(q, k, v, g, beta, ref_pool, ids, 0.3, True))
    close(pool, ref_pool)
    print("ROUTED", sorted(set(routed)))
""")


def test_amd_triton_path_matches_the_reference_under_the_interpreter():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ROUTED ['cache_write', 'indexer_score', 'kda_decode', 'lse_combine', 'positions_to_slots', " \
           "'sparse_mla', 'topk']" in done.stdout
