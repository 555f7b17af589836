"""Which PPU calls go to the shared Triton kernels, and that the PPU's wiring of those kernels gives
the reference's answers (run under the Triton interpreter on the CPU, not on a PPU)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dsahal.backends.ppu import routes, verifiers

META = "meta"


@pytest.fixture
def on_kernel_device(monkeypatch):
    """Meta tensors stand in for device tensors: the rules read metadata only."""
    monkeypatch.setattr(routes, "KERNEL_DEVICE_TYPE", META)
    monkeypatch.delenv("DSAHAL_PPU_TRITON", raising=False)


def _t(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device=META)


def _mla_args(fmt="bf16", token_bytes=1152):
    return _t(2, 16, 576), _t(4, 8, token_bytes, dtype=torch.uint8), _t(2, 32, dtype=torch.int32), fmt, None, 0.1


def _indexer_args(q_dtype=torch.float32, fmt="bf16", heads=4):
    i32 = torch.int32
    return (_t(3, heads, 128, dtype=q_dtype), _t(3, heads), _t(4, 8, 256, dtype=torch.uint8), _t(2, 4, dtype=i32),
            _t(3, dtype=i32), _t(3, dtype=i32), fmt, 32)


def test_bf16_calls_take_the_triton_kernels(on_kernel_device):
    assert routes.takes_sparse_mla(*_mla_args()) == (True, "")
    assert routes.takes_indexer_score(*_indexer_args()) == (True, "")
    assert routes.takes_topk(_t(3, 100), _t(3, dtype=torch.int32), 8) == (True, "")
    assert routes.takes_lse_combine(_t(2, 3, 4, 8), _t(2, 3, 4)) == (True, "")


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla", "nvfp4"])
def test_fp8_and_fp4_latents_stay_portable_with_the_reason(on_kernel_device, fmt):
    takes, reason = routes.takes_sparse_mla(*_mla_args(fmt))
    assert not takes and f"latent format {fmt!r}" in reason


def test_fp8_queries_and_non_bf16_keys_stay_portable(on_kernel_device):
    assert "fp8 queries" in routes.takes_indexer_score(*_indexer_args(q_dtype=torch.float8_e4m3fn))[1]
    assert "index format 'mxfp4'" in routes.takes_indexer_score(*_indexer_args(fmt="mxfp4"))[1]
    assert "at most 128" in routes.takes_indexer_score(*_indexer_args(heads=256))[1]


def test_kda_decode_needs_dense_rows_for_the_kernel(on_kernel_device):
    q, k, v = _t(2, 2, 8), _t(2, 2, 8), _t(2, 2, 6)
    strided_g = torch.empty(2, 2, 16, device=META)[..., ::2]
    args = (q, k, v, strided_g, _t(2, 2), _t(3, 2, 8, 6), _t(2, dtype=torch.int32), 0.3, True)
    takes, reason = routes.takes_kda_decode(*args)
    assert not takes and "'g' has stride 2" in reason


def test_environment_switch_turns_every_triton_route_off(monkeypatch):
    monkeypatch.setenv("DSAHAL_PPU_TRITON", "0")
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "dsahal.backends.ppu.cpu_twin")
    assert routes.triton_enabled() == (False, "DSAHAL_PPU_TRITON=0")  # the triton routes' probe
    from dsahal.registry import reset, set_backend

    reset()
    table = set_backend("ppu-cpu-twin")
    try:
        for op, entry in table.entries.items():
            triton = [r for r in entry.routes if r.name == "triton"]
            assert all(not r.available and r.reason == "DSAHAL_PPU_TRITON=0" for r in triton), op
    finally:
        reset()


def test_host_tensors_never_take_a_triton_kernel():
    takes, reason = routes.takes_lse_combine(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4))
    assert not takes and "'o_parts' is on cpu" in reason


def test_verifier_limits_apply_only_to_the_portable_path(on_kernel_device, monkeypatch):
    wide, lengths = _t(1, 1 << 24), _t(1, dtype=torch.int32)
    assert routes.takes_topk(wide, lengths, 8) == (True, "")  # the radix-select kernel has no width limit
    ok, reason = verifiers.portable_topk(wide, lengths, 8)
    assert not ok and "2^24" in reason


INTERPRETED = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from dsahal.backends.ppu import ops, portable_attention, portable_index, portable_kda, routes
    from dsahal.reference import cache, indexer, kda, lse_combine, slots, sparse_mla, topk
    routes.KERNEL_DEVICE_TYPE = "cpu"  # the interpreter runs the kernels on host tensors
    def refuse(*args, **kwargs):
        raise AssertionError("the portable path ran where the Triton route was expected")
    for module in (portable_attention, portable_index, portable_kda):
        for name in ("lse_combine", "positions_to_slots", "topk", "indexer_score", "sparse_mla", "kda_decode"):
            if hasattr(module, name):
                setattr(module, name, refuse)
    torch.manual_seed(0)
    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    o, lse = torch.randn(3, 4, 2, 16), torch.randn(3, 4, 2)
    lse[0, 1] = float("-inf")
    for got, want in zip(ops.lse_combine(o, lse), lse_combine.lse_combine(o, lse)):
        close(got, want)

    table = torch.tensor([[2, 0, -1, 4], [1, 3, 4, 0]], dtype=torch.int32)
    req, pos = torch.tensor([0, 1, 1], dtype=torch.int32), torch.randint(-1, 16, (3, 5)).int()
    assert torch.equal(ops.positions_to_slots(pos, req, table, 4), slots.positions_to_slots(pos, req, table, 4))

    scores, lengths = torch.randint(0, 4, (3, 50)).float(), torch.tensor([50, 10, 0], dtype=torch.int32)
    got, want = ops.topk(scores, lengths, 7), topk.topk(scores, lengths, 7)
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]

    index_pages = torch.zeros(5, 4, 256, dtype=torch.uint8)
    cache.cache_write(torch.randn(20, 128), torch.arange(20), index_pages, "index", "bf16", None)
    args = (torch.randn(3, 4, 128), torch.randn(3, 4), index_pages, table, req, torch.tensor([3, 9, 15]), "bf16", 16)
    got, want = ops.indexer_score(*args), indexer.indexer_score(*args)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    close(got[torch.isfinite(want)], want[torch.isfinite(want)])

    latent_pages = torch.zeros(4, 4, 1152, dtype=torch.uint8)
    cache.cache_write(torch.randn(16, 576), torch.arange(16), latent_pages, "latent", "bf16", None)
    args = (torch.randn(2, 16, 576), latent_pages, torch.tensor([[0, 5, -1, 7], [-1] * 4], dtype=torch.int32), "bf16",
            None, 0.05)
    got, want = ops.sparse_mla(*args), sparse_mla.sparse_mla(*args)
    close(got[0], want[0])
    assert torch.equal(torch.isinf(got[1]), torch.isinf(want[1]))

    q, k, v, g, beta = torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 6), -torch.rand(3, 2, 8), torch.rand(3, 2)
    pool = torch.randn(4, 2, 8, 6)
    ref_pool, ids = pool.clone(), torch.tensor([2, -1, 0], dtype=torch.int32)
    close(ops.kda_decode(q, k, v, g, beta, pool, ids, 0.3, True), kda.kda_decode(q, k, v, g, beta, ref_pool, ids, 0.3, True))
    close(pool, ref_pool)
    print("ALL ROUTES OK")
""")


def test_ppu_triton_routes_match_the_reference_under_the_interpreter():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALL ROUTES OK" in done.stdout
