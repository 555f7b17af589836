"""The AMD backend's declaration: probe, fast-path presence, routing limits, merge selection,
capabilities and block sizes. Runs on a CPU-only machine with no AMD package installed."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal import ops
from dsahal.backends.amd import arch, collectives, config, limits, paths, plugin, routes
from dsahal.ops.catalog import OP_NAMES
from dsahal.reference.topk import topk as reference_topk


@pytest.fixture(autouse=True)
def fresh_router(monkeypatch):
    monkeypatch.delenv(routes.PATHS_ENV, raising=False)
    monkeypatch.delenv(collectives.MERGE_ENV, raising=False)
    routes.reset()
    yield
    routes.reset()


# -- probe and presence -----------------------------------------------------------------------------

def test_gcn_arch_names_lose_their_target_features():
    assert arch.parse_gcn_arch("gfx942:sramecc+:xnack-") == "gfx942"
    assert arch.parse_gcn_arch("gfx950") == "gfx950"
    with pytest.raises(ValueError, match="dsahal.amd: expected a gcnArchName"):
        arch.parse_gcn_arch("sm_90")


def test_gfx942_reads_fnuz_fp8_and_only_gfx950_has_native_fp4():
    assert arch.ARCHS["gfx942"].fp8_dtype == torch.float8_e4m3fnuz and not arch.ARCHS["gfx942"].native_fp4
    assert arch.ARCHS["gfx950"].fp8_dtype == torch.float8_e4m3fn and arch.ARCHS["gfx950"].native_fp4


def test_probe_says_why_a_cpu_torch_cannot_run_it():
    ok, reason = plugin.probe()
    assert not ok and "not a ROCm build (torch.version.hip is None)" in reason


def test_probe_runs_triton_only_on_a_cuda_gpu_and_says_it_is_not_rocm(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    assert not plugin.probe()[0]
    monkeypatch.setenv(routes.PATHS_ENV, "triton")
    ok, reason = plugin.probe()
    assert ok and "verification mode" in reason and "not a ROCm run" in reason and "NVIDIA H200" in reason


def test_every_vendor_path_reports_why_it_is_absent_here():
    report = paths.presence_report()
    for path in paths.FAST_PATHS:
        present, reason = report[path.name]
        assert not present and "not installed" in reason


def test_presence_follows_the_architecture_once_the_packages_are_installed(monkeypatch):
    monkeypatch.setattr(paths, "distribution_version", lambda name: "1.0")
    fly = paths.PATHS_BY_NAME["flydsl.sparse_mla"]
    aiter = paths.PATHS_BY_NAME["aiter.sparse_mla"]
    assert paths.path_presence(fly, "gfx950")[0] and paths.path_presence(aiter, "gfx942")[0]
    present, reason = paths.path_presence(fly, "gfx942")
    assert not present and "gfx942 is not one of ['gfx950']" in reason
    assert "not a ROCm build" in paths.path_presence(aiter)[1]


def test_paths_env_forces_the_triton_paths():
    report = {"triton": (True, "ok"), "aiter.topk": (True, "ok"), "flydsl.sparse_mla": (True, "ok")}
    status = routes.enabled_paths(report, allow="triton")
    assert status["triton"] == "" and "disabled by DSAHAL_AMD_PATHS=triton" in status["aiter.topk"]
    status = routes.enabled_paths(report, allow="aiter")
    assert status["aiter.topk"] == "" and status["flydsl.sparse_mla"] and status["triton"]


def test_versions_list_every_path_and_the_packages():
    found = plugin.versions()
    assert found["amd-aiter"] == "not installed" and found["hip"] == "not a ROCm build"
    for path in paths.FAST_PATHS:
        assert found[f"path {path.name}"].startswith("off (")


def test_capabilities_report_every_op_unverified_on_rocm_hardware():
    caps = plugin.capabilities()
    assert set(caps.unverified) == set(OP_NAMES)
    assert all("never run" in why for why in caps.unverified.values())
    assert "mxfp4" not in caps.index_formats  # the FP4 path is absent here


def test_batch_invariance_is_claimed_only_in_its_mode_on_the_triton_paths(monkeypatch):
    assert not plugin.capabilities().batch_invariant
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    assert plugin.capabilities().batch_invariant  # here every vendor path is absent
    monkeypatch.setattr(routes, "enabled_paths", lambda: {"aiter.sparse_mla": "", "triton": ""})
    assert not plugin.capabilities().batch_invariant


def test_the_backend_serves_every_op_and_a_verifier_for_each_routed_one():
    backend = plugin.amd_backend()
    assert set(backend.ops) == set(OP_NAMES) - {"dsa_attention"}  # the registry's composite serves it
    assert all(route.verifier for op in routes.ROUTES for route in backend.routes(op))
    assert [r.name for r in backend.routes("sparse_mla")] == ["aiter.sparse_mla", "flydsl.sparse_mla", "triton"]
    assert backend.tags == frozenset({"gpu", "rocm"})


# -- routing limits ---------------------------------------------------------------------------------

def amd_table(status=None):
    """The registry's op table for the amd backend with the path status pinned (None: the real one)."""
    from dsahal.ops.catalog import COMPOSITE_OPS
    from dsahal.reference.plugin import reference_backend
    from dsahal.registry import BackendRecord, OpTable

    backend = plugin.amd_backend()
    routes.reset(status)
    return OpTable(BackendRecord(backend, "amd", True, "test"), BackendRecord(reference_backend(), "reference", True, ""),
                   OP_NAMES, COMPOSITE_OPS)


def every_path_enabled():
    return amd_table({**{p.name: "" for p in paths.FAST_PATHS}, "triton": "", "rccl": "", "merge": ""})


def on_gpu_of(monkeypatch, gfx):
    """Let the limits see CPU tensors as if on a device of ``gfx`` (routing logic only: nothing runs)."""
    monkeypatch.setattr(limits, "on_gpu", lambda **tensors: (True, ""))
    monkeypatch.setattr(limits, "gfx_of", lambda tensor: gfx)


def mla_args(kv_fmt, heads, tokens=3, q_dtype=torch.bfloat16, width=64):
    token_bytes = {"bf16": 1152, "fp8": 576, "fp8_ds_mla": 656}[kv_fmt]
    pages = torch.zeros(4, 16, token_bytes, dtype=torch.uint8)
    scale = torch.tensor(1.0) if kv_fmt == "fp8" else None
    return (torch.zeros(tokens, heads, 576, dtype=q_dtype), pages, torch.zeros(tokens, width, dtype=torch.int32),
            kv_fmt, scale, 0.1)


def indexer_args(index_fmt, heads=32, block_tokens=64):
    token_bytes = {"bf16": 256, "fp8": 132, "mxfp4": 68}[index_fmt]
    return (torch.zeros(2, heads, 128), torch.zeros(2, heads), torch.zeros(3, block_tokens, token_bytes, dtype=torch.uint8),
            torch.zeros(1, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
            index_fmt, 100)


@pytest.mark.parametrize("gfx, kv_fmt, heads, q_dtype, expected", [
    ("gfx950", "bf16", 16, torch.bfloat16, "aiter.sparse_mla"),
    ("gfx950", "bf16", 32, torch.bfloat16, "triton"),  # no AITER bf16 kernel for 32 heads
    ("gfx950", "fp8", 16, torch.bfloat16, "flydsl.sparse_mla"),
    ("gfx942", "fp8", 16, torch.bfloat16, "triton"),  # FlyDSL sparse MLA is gfx950 only
    ("gfx950", "fp8_ds_mla", 128, torch.float32, "triton"),
])
def test_sparse_mla_takes_the_first_path_whose_limits_accept(monkeypatch, gfx, kv_fmt, heads, q_dtype, expected):
    on_gpu_of(monkeypatch, gfx)
    route, _ = every_path_enabled().choose("sparse_mla", *mla_args(kv_fmt, heads, q_dtype=q_dtype))
    assert route == expected


@pytest.mark.parametrize("gfx, index_fmt, expected", [
    ("gfx950", "mxfp4", "flydsl.indexer_mxfp4"), ("gfx942", "mxfp4", None),
    ("gfx942", "fp8", "aiter.indexer_fp8"), ("gfx950", "bf16", "triton"),
])
def test_indexer_routes_by_key_format_and_architecture(monkeypatch, gfx, index_fmt, expected):
    on_gpu_of(monkeypatch, gfx)
    route, declined = every_path_enabled().choose("indexer_score", *indexer_args(index_fmt))
    assert route == expected
    if route is None:
        why = "; ".join(f"{name}: {reason}" for name, reason in declined)
        assert "gfx942" in why and "'mxfp4'" in why  # every refusal is listed


def test_flydsl_sparse_mla_states_its_row_and_width_limits(monkeypatch):
    on_gpu_of(monkeypatch, "gfx950")
    ok, why = limits.flydsl_sparse_mla(*mla_args("fp8", 16, tokens=97))
    assert not ok and "1..96 rows" in why
    ok, why = limits.flydsl_sparse_mla(*mla_args("fp8", 16, width=33 * 64 + 1))
    assert not ok and "1..2112 slots" in why


def test_triton_only_mode_sends_fp8_sparse_mla_to_triton(monkeypatch):
    on_gpu_of(monkeypatch, "gfx950")
    status = routes.enabled_paths({**{p.name: (True, "") for p in paths.FAST_PATHS}, "triton": (True, "")},
                                  allow="triton")
    route, declined = amd_table(status).choose("sparse_mla", *mla_args("fp8", 16))
    assert route == "triton" and "disabled by DSAHAL_AMD_PATHS=triton" in dict(declined)["flydsl.sparse_mla"]


def test_cpu_tensors_are_refused_with_every_reason():
    table = amd_table()
    route, _ = table.choose("sparse_mla", *mla_args("bf16", 16))
    why = table.explain("sparse_mla", *mla_args("bf16", 16))
    assert route is None and "triton: 'q' is on cpu" in why and "aiter.sparse_mla: amd-aiter not installed" in why


# -- merge selection --------------------------------------------------------------------------------

def test_the_score_only_merge_is_the_default_and_packed_is_selectable(monkeypatch):
    from dsahal.backends.amd.score_only_merge import score_only_topk_merge
    from dsahal.distributed.merge import exact_topk_merge

    assert collectives.merge_algorithm() is score_only_topk_merge
    monkeypatch.setenv(collectives.MERGE_ENV, "packed")
    assert collectives.merge_algorithm() is exact_topk_merge
    monkeypatch.setenv(collectives.MERGE_ENV, "radix")
    with pytest.raises(ValueError, match="DSAHAL_AMD_TOPK_MERGE expected one of"):
        collectives.merge_algorithm()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 4), width=st.integers(1, 30), k=st.integers(1, 40),
       ties=st.booleans())
def test_one_rank_score_only_merge_is_the_single_device_topk(seed, rows, width, k, ties):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (rows, width), generator=gen).float() if ties else torch.randn(rows, width, generator=gen)
    scores[torch.rand(rows, width, generator=gen) < 0.2] = float("-inf")
    lengths = torch.randint(0, width + 1, (rows,), generator=gen).int()
    got = collectives.topk_merge(scores, lengths, k, None)
    assert torch.equal(got, reference_topk(scores, lengths, k))
    assert torch.equal(got, ops.topk(scores, lengths, k))


# -- block sizes ------------------------------------------------------------------------------------

def test_num_warps_counts_64_lane_wavefronts():
    assert config.wavefronts_for_threads(256) == 4 and config.wavefronts_for_threads(32) == 1
    assert config.topk_config()["num_warps"] * arch.WAVEFRONT == 256


@pytest.mark.parametrize("gfx", ["gfx942", "gfx950", None])
@pytest.mark.parametrize("heads", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("tokens, k", [(1, 2048), (64, 2048), (3, 100)])
def test_sparse_mla_tiles_fit_the_lds_and_splits_are_whole_steps(gfx, heads, tokens, k):
    cfg = config.sparse_mla_config(gfx, tokens, heads, k)
    lds = config.LDS_BYTES.get(gfx, config.LDS_BYTES["gfx942"])
    assert config.sparse_mla_tile_bytes(cfg["block_h"], cfg["block_n"]) <= lds
    assert cfg["split_size"] is None or (cfg["split_size"] % cfg["block_n"] == 0 and cfg["split_size"] < k)
