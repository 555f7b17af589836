"""The NVIDIA backend's declaration, verifiers, block-size policy and bench command, on the CPU."""
from __future__ import annotations

import pytest
import torch

from dsahal.backends.nvidia import config, kda_fla
from dsahal.backends.triton_kernels import limits
from dsahal.backends.nvidia.plugin import nvidia_backend
from dsahal.ops.catalog import OP_NAMES
from dsahal.registry import resolve_lazy


def test_declares_every_op_as_routes_and_each_reference_resolves():
    backend = nvidia_backend()
    assert set(backend.ops) == set(OP_NAMES) and not backend.verifiers
    assert [r.name for r in backend.routes("sparse_mla")] == ["gluon_wgmma_few_heads", "gluon_wgmma_nvfp4",
                                                                 "flashmla_decode", "flashmla_prefill", "gluon_few_heads",
                                                                 "triton_small_heads", "triton"]
    # (fla_chunk after the route that takes every call: forced only, its results past the bf16 bound under strong
    # decay)
    assert [r.name for r in backend.routes("kda_prefill")] == ["triton_short", "triton_chunk_mixed",
                                                              "triton_recurrent", "fla_chunk", "triton_chunk"]
    pytest.importorskip("triton")
    for op in OP_NAMES:
        for route in backend.routes(op):
            for ref in (route.fn, route.verifier, route.probe):
                assert ref is None or callable(resolve_lazy(ref)), (op, route.name)


def test_probe_says_why_it_is_unavailable_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    ok, reason = nvidia_backend().probe()
    assert not ok and "CUDA" in reason


def test_claims_only_formats_with_kernels():
    caps = nvidia_backend().capabilities
    assert caps.latent_formats == {"bf16", "fp8", "fp8_ds_mla", "nvfp4"}
    assert caps.index_formats == {"bf16", "fp8", "mxfp4"}
    assert caps.deterministic


def test_claims_batch_invariance_only_in_batch_invariant_mode(monkeypatch):
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT", raising=False)
    assert not nvidia_backend().capabilities.batch_invariant
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    assert nvidia_backend().capabilities.batch_invariant


def test_verifiers_reject_cpu_tensors_with_a_reason():
    q = torch.zeros(2, 4, 576)
    pages = torch.zeros(2, 16, 1152, dtype=torch.uint8)
    slots = torch.zeros(2, 8, dtype=torch.int32)
    ok, reason = limits.sparse_mla(q, pages, slots, "bf16", None, 0.1)
    assert not ok and "cuda" in reason.lower()


@pytest.mark.parametrize("kind,fmt", [("latent", "nvfp4"), ("index", "mxfp4")])
def test_the_triton_cache_write_encodes_the_fp4_formats(kind, fmt):
    values = torch.zeros(2, 576 if kind == "latent" else 128)
    ok, reason = limits.cache_write(values, torch.zeros(2, dtype=torch.int32),
                                    torch.zeros(1, 4, 8, dtype=torch.uint8), kind, fmt, None)
    assert not ok and "cuda" in reason.lower()  # the format is taken; only the CPU tensors are refused


def test_sparse_mla_split_depends_on_the_batch_only_outside_invariant_mode(monkeypatch):
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT", raising=False)
    assert config.sparse_mla_config(8, 128, 2048)["split_size"] != config.sparse_mla_config(320, 128, 2048)["split_size"]
    config.read_mode()
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    config.read_mode()  # the backend re-reads the mode when the registry is built, not per call
    assert config.sparse_mla_config(8, 128, 2048) == config.sparse_mla_config(320, 128, 2048)
    assert config.sparse_mla_config(1, 16, 2048) == config.sparse_mla_config(4096, 16, 2048)


def test_topk_never_takes_the_radix_method_in_invariant_mode(monkeypatch):
    # the radix method orders a row's slots otherwise than bound and groups (index order, the same bits): a row's
    # slots would depend on the call's width if invariant mode took it for short rows
    widths = (100, 2048, 4096, 4097, 8192, 8193, 32768, 65536, 131072, 1 << 20)
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT", raising=False)
    config.read_mode()
    default = {w: config.topk_config(w).get("method", "radix") for w in widths}
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    config.read_mode()
    invariant = {w: config.topk_config(w).get("method", "radix") for w in widths}
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT")
    config.read_mode()
    # rows of <= 8K: the registers method in both modes (index order, the bound method's bits), 8 warps past 4K;
    # wider rows the same method in both modes; the radix method in neither
    assert all(default[w] == invariant[w] == "registers" for w in (100, 2048, 4096, 4097, 8192)), (default, invariant)
    assert [config.topk_config(w)["num_warps"] for w in (4096, 4097, 8192)] == [4, 8, 8]
    assert default[8193] == invariant[8193] == "bound"
    assert all(invariant[w] == default[w] != "radix" for w in widths), (default, invariant)
    from dsahal.backends.triton_kernels import topk_registers

    assert config.REGISTERS_TOPK_ROWS <= topk_registers.MAX_WIDTH  # (the rows it routes fit the kernel)
    assert config.topk_config(131072)["segment_histograms"] and config.topk_config(131072)["compact_prefetch"]
    assert not config.topk_config(1 << 20).get("segment_histograms"), "the 1M launch is the one measured there"


def _kda_prefill_args(dtype, device="cuda"):
    x = torch.empty(4, 2, 16, dtype=dtype, device="meta")
    pool = torch.empty(3, 2, 16, 16, device="meta")
    return (x, x, x, x, torch.empty(4, 2, dtype=dtype, device="meta"), torch.empty(2, dtype=torch.int32, device="meta"),
            pool, torch.empty(1, dtype=torch.int32, device="meta"), 0.25, True)


def test_kda_prefill_leaves_fla_in_invariant_mode(monkeypatch):
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    config.read_mode()
    ok, reason = kda_fla.accepts(*_kda_prefill_args(torch.bfloat16))
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT")
    config.read_mode()
    assert not ok and "batch-invariant" in reason


def test_kda_prefill_keeps_fp32_inputs_on_the_exact_recurrent_kernel(monkeypatch):
    monkeypatch.delenv("DSAHAL_BATCH_INVARIANT", raising=False)
    config.read_mode()
    ok, reason = kda_fla.accepts(*_kda_prefill_args(torch.float32))
    assert not ok and "fp32" in reason


def test_bench_declares_a_case_for_every_timed_op():
    from dsahal.bench.cases import all_cases

    ops = {case.op for case in all_cases(quick=True)}
    assert {"indexer_score", "topk", "sparse_mla", "lse_combine", "kda_decode", "kda_prefill", "dsa_attention",
            "cache_write"} <= ops


def test_bench_checks_pass_on_the_reference_backend():
    """The harness itself: each correctness check compares two runs; reference vs reference must agree."""
    from dsahal.bench.cases import check_lse_combine, check_topk

    assert check_topk(torch.device("cpu"), "reference")[0]
    assert check_lse_combine(torch.device("cpu"), "reference")[0]


def test_the_indexer_takes_queries_and_weights_of_any_stride():
    """A strided q or weights (a transposed or sliced projection output) is copied by the launcher, a few KB: the
    verifier must not send the call to the float64 reference over every key. Only the device is checked."""
    q = torch.randn(3, 8, 256)[..., ::2]  # [3, 8, 128] with stride 2 in its last dim
    weights = torch.randn(8, 3).t()  # [3, 8] with stride 3 in its last dim
    pages = torch.zeros(4, 16, 132, dtype=torch.uint8)
    table = torch.zeros(2, 4, dtype=torch.int32)
    ids = torch.zeros(3, dtype=torch.int32)
    anywhere = lambda **tensors: (True, "")  # noqa: E731 - the CPU stands in for the device here
    assert limits.indexer_score(q, weights, pages, table, ids, ids, "fp8", 64, device_check=anywhere) == (True, "")
    ok, reason = limits.indexer_score(q, weights, pages, table, ids, ids, "fp8", 64)
    assert not ok and "cuda" in reason.lower()  # the device rule still applies
    ok, reason = limits.indexer_score(torch.randn(3, 129, 128), torch.randn(3, 129), pages, table, ids, ids, "fp8", 64,
                                      device_check=anywhere)
    assert not ok and "at most 128 heads" in reason


def test_kda_verifiers_decline_a_gate_without_unit_channel_stride():
    """The Triton KDA kernel steps through g's channels one element at a time; a strided g (which a
    caller skipping validation could pass) must go to the reference, not be misread."""
    import torch

    from dsahal.backends.amd import limits as amd_limits

    q = torch.randn(2, 4, 16)
    v = torch.randn(2, 4, 16)
    g = torch.randn(2, 4, 32)[..., ::2]  # [2, 4, 16] with stride 2 in K
    pool = torch.zeros(3, 4, 16, 16)
    ids = torch.tensor([0, 1], dtype=torch.int32)
    beta = torch.rand(2, 4)
    ok, reason = limits.kda_decode(q, q, v, g, beta, pool, ids, 0.25, True)
    assert not ok and "'g' has stride 2" in reason
    ok, reason = amd_limits.triton_kda_decode(q, q, v, g, beta, pool, ids, 0.25, True)
    assert not ok and "'g' has stride 2" in reason


def test_kernel_limits_list_exactly_the_formats_the_cache_write_kernel_encodes():
    from dsahal.backends.triton_kernels import limits
    from dsahal.backends.triton_kernels.cache_write import format_code
    from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS

    every = {("latent", f) for f in LATENT_FORMATS} | {("index", f) for f in INDEX_FORMATS}
    assert {pair for pair in every if format_code(*pair) is not None} == limits.CACHE_WRITE_FORMATS


def test_kernel_limits_import_without_triton():
    import subprocess
    import sys

    code = ("import sys; sys.modules['triton'] = None; "
            "from dsahal.backends.triton_kernels import limits; print(sorted(limits.LATENT_FORMATS))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("heads", [1, 16, 32, 128])
@pytest.mark.parametrize("kv_fmt", ["bf16", "fp8", "fp8_ds_mla"])
def test_sparse_mla_exact_fp32_path_takes_tiles_that_fit_shared_memory(heads, kv_fmt):
    """fp32 queries run fp32 dots: the bf16 tiles asked the H200 for 258-349 KB of shared memory
    (conformance, 2026-11-29). Operand bytes per stage must stay well under its 227 KB."""
    cfg = config.sparse_mla_config(4, heads, 2048, kv_fmt, torch.float32)
    operand_bytes = 4 * 576 * (cfg["block_h"] + cfg["block_n"] * cfg["num_stages"])
    assert operand_bytes <= 120 * 1024, cfg
    assert cfg != config.sparse_mla_config(4, heads, 2048, kv_fmt, torch.bfloat16)


def test_the_few_heads_route_takes_the_formats_it_measured_faster_on():
    from dsahal.backends.nvidia.verifiers import small_heads_accepts

    def call(fmt, heads=16, dtype=torch.bfloat16):
        record = {"fp8_ds_mla": 656, "nvfp4": 352, "bf16": 1152, "fp8": 576}[fmt]
        q = torch.empty((3, heads, 576), dtype=dtype, device="meta")
        pages = torch.empty((4, 64, record), dtype=torch.uint8, device="meta")
        return small_heads_accepts(q, pages, torch.empty((3, 64), dtype=torch.int32, device="meta"), fmt, None, 0.1)

    for fmt in ("bf16", "fp8"):
        ok, why = call(fmt)
        assert not ok and "general kernel measured faster" in why
    ok, why = call("fp8_ds_mla", heads=48)
    assert not ok and "48 heads" in why
    ok, why = call("nvfp4", dtype=torch.float32)
    assert not ok and "float32 queries" in why
    ok, why = call("fp8_ds_mla")
    assert not ok and "GPU" in why  # past its own limits: the meta tensors are not on a GPU


def test_the_mixed_chunked_route_takes_16_bit_inputs_and_leaves_fp32_to_the_exact_kernel():
    from dsahal.backends.nvidia.verifiers import chunk_mixed_accepts

    def call(dtype, key_dim=128, value_dim=128):
        tokens, heads = 600, 2
        q, k = (torch.randn(tokens, heads, key_dim).to(dtype) for _ in range(2))
        v = torch.randn(tokens, heads, value_dim).to(dtype)
        g = -torch.rand(tokens, heads, key_dim)
        beta = torch.rand(tokens, heads).to(dtype)
        cu = torch.tensor([0, 100, tokens], dtype=torch.int32)
        pool = torch.zeros(2, heads, key_dim, value_dim)
        return chunk_mixed_accepts(q, k, v, g, beta, cu, pool, torch.tensor([0, 1], dtype=torch.int32), None, True)

    ok, reason = call(torch.bfloat16)  # past the route's own checks, to the kernels' limits (CPU tensors here)
    assert not ok and "cuda" in reason and "recurrent" not in reason, reason
    ok, reason = call(torch.float32)
    assert not ok and "fp32" in reason and "recurrent" in reason, reason
    ok, reason = call(torch.bfloat16, key_dim=192)
    assert not ok and "K = 192" in reason, reason
    # V past 128 runs in slices of value columns (the launcher's max_v): refused only where the kernels' limits say
    ok, reason = call(torch.bfloat16, value_dim=256)
    assert not ok and "cuda" in reason and "V = " not in reason, reason
