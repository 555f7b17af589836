"""The wgmma NVFP4 sparse MLA kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4`) on a CPU machine.

Gluon has no interpreter, so its results are checked on the H200 only (``scripts/h200/wgmma_fp4_check.py`` against the
float64 reference on the edge cases and at the serving shape, the conformance suite through the route). Here: what
the launcher serves and refuses, that its three views of a stage's codes are one swizzled placement, that the dims the
MMAs read (the queries loaded through :func:`logit_dim` / :func:`rope_dim`, the output stored through
:func:`value_dim`) are the dims the decoded bytes hold, that the kernel compiles for sm_90 without spilling at two
programs a SM, and what the route's verifier says.
"""
from __future__ import annotations

import pytest
import torch
from launch_recorder import LaunchRecorder
from test_sparse_mla_wgmma import step_loop_local_memory

from dsahal.backends.triton_kernels import sparse_mla_wgmma_fp4 as w


def _pages(blocks=4, block_tokens=16, device="cpu", record=352):
    return torch.zeros(blocks, block_tokens, record, dtype=torch.uint8, device=device)


def test_serves_bf16_queries_of_at_most_16_heads_on_aligned_nvfp4_pages_on_a_cuda_device_only(monkeypatch):
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    assert w.refusal(q, _pages(), "nvfp4") == "the wgmma NVFP4 kernel runs on NVIDIA CUDA tensors only"
    assert w.refusal(q, _pages(record=656), "fp8_ds_mla") == "fp8_ds_mla latents: the wgmma NVFP4 kernel reads nvfp4 records"
    assert w.refusal(q.float(), _pages(), "nvfp4") == "float32 queries: the wgmma NVFP4 kernel takes bf16"
    assert w.refusal(torch.zeros(2, 17, 576, dtype=torch.bfloat16), _pages(), "nvfp4") == (  # any head count
        "the wgmma NVFP4 kernel runs on NVIDIA CUDA tensors only")
    assert w.refusal(torch.zeros(2, 16, 512, dtype=torch.bfloat16), _pages(), "nvfp4") == (
        "q of shape [2, 16, 512]: the wgmma NVFP4 kernel takes [T, H, 576]")
    meta = torch.empty(2, 16, 576, dtype=torch.bfloat16, device="meta")
    assert not w.serves(meta, _pages(device="meta"), "nvfp4")
    from dsahal.backends.triton_kernels import sparse_mla_gluon

    monkeypatch.setattr(sparse_mla_gluon, "runs_ptx", lambda device: True)  # past the device: the pages' own checks
    assert w.refusal(q, _pages(record=656), "nvfp4") == (
        "pages torch.uint8 [4, 16, 656]: the wgmma NVFP4 kernel reads uint8 [blocks, tokens, 352]")
    assert w.refusal(q, torch.zeros(4, 16, 353, dtype=torch.uint8)[..., 1:], "nvfp4") == (
        "records aligned to 1 byte(s): the wgmma NVFP4 kernel copies 16-byte pieces")
    assert w.refusal(q, _pages(), "nvfp4") == ""


def test_a_call_it_does_not_serve_raises_naming_the_op_and_what_it_got():
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"triton sparse_mla_wgmma_fp4: expected bf16 q .* nvfp4 uint8 pages "
                                         r"\[num_blocks, block_tokens, 352\] .* got q torch.bfloat16 \[2, 16, 576\] on cpu"):
        w.sparse_mla_wgmma_fp4(q, _pages(), torch.zeros(2, 8, dtype=torch.int32), "nvfp4", None, 0.1)


@pytest.mark.parametrize("kwargs, message", [(dict(stages=1), "stages expected 2, 3 or 4, got 1"),
                                             (dict(stages=5), "stages expected 2, 3 or 4, got 5"),
                                             (dict(split_size=0), "split_size expected None or >= 1, got 0"),
                                             (dict(in_flight=3), "in_flight expected 1 or 2, got 3")])
def test_launch_parameters_are_checked_before_any_launch(monkeypatch, kwargs, message):
    monkeypatch.setattr(w, "refusal", lambda *args: "")  # past the device check: the parameters' own
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"triton sparse_mla_wgmma_fp4: {message}"):
        w.sparse_mla_wgmma_fp4(q, _pages(), torch.zeros(2, 8, dtype=torch.int32), "nvfp4", None, 0.1, **kwargs)


def _index(bases, offset, rank):
    """A linear layout's index for ``offset``: the XOR of the bases of its set bits."""
    index = [0] * rank
    for bit, basis in enumerate(bases):
        if offset >> bit & 1:
            index = [a ^ b for a, b in zip(index, basis)]
    return tuple(index)


def _placed(slot, piece, byte):
    """Where a stage keeps byte ``byte`` of 16-byte piece ``piece`` of a slot's 256 code bytes (the module's comment):
    piece ``p ^ g(slot)``, ``g(R) = (R & 6) ^ ((R & 1) << 2)``."""
    return slot * 256 + 16 * (piece ^ ((slot & 6) ^ ((slot & 1) << 2))) + byte


def _views():
    """Each view as (bases, rank, index -> (slot, code byte of the slot's 256))."""
    return {
        "copy": (w._copy_view_layout().offset_bases, 2, lambda i: (i[0], i[1])),
        "logit": (w._logit_view_layout().offset_bases, 5,  # [8 h, 64 R, 4 c, 2 g0, 4 e], h = g1 + 2 t
                  lambda i: (i[1], 16 * (4 * (i[0] >> 1) + i[2]) + 4 * (i[3] + 2 * (i[0] & 1)) + i[4])),
        "value": (w._value_view_layout().offset_bases, 4,  # [64 R, 4 w, 8 r, 8 e]
                  lambda i: (i[0], 64 * i[1] + 8 * i[2] + i[3])),
    }


@pytest.mark.parametrize("view", ["copy", "logit", "value"])
def test_each_view_of_the_codes_is_the_one_swizzled_placement(view):
    bases, rank, meaning = _views()[view]
    seen = set()
    for offset in range(64 * 256):
        slot, code_byte = meaning(_index(bases, offset, rank))
        assert offset == _placed(slot, code_byte >> 4, code_byte & 15), (view, offset)
        seen.add((slot, code_byte))
    assert len(seen) == 64 * 256


def test_the_logit_columns_are_the_dims_the_decoded_nibbles_hold():
    """The decode gives (low, high) nibble of each loaded byte; ``join`` puts the nibble last, the operand's permute
    (_TO_LOGIT_COLUMNS) of [R, c, g0, e1, e0, a] makes column k = e0 + 2 c + 8 e1 + 16 a + 32 g0; the view gives the
    byte's place in the record (code byte B holds dims 2 B and 2 B + 1)."""
    assert w._TO_LOGIT_COLUMNS.value == (0, 2, 5, 3, 1, 4)
    _, _, meaning = _views()["logit"]
    dims = set()
    for h in range(8):
        for c in range(4):
            for g0 in range(2):
                for e in range(4):
                    for a in range(2):
                        _, code_byte = meaning((h, 0, c, g0, e))
                        k = (e & 1) + 2 * c + 8 * (e >> 1) + 16 * a + 32 * g0
                        assert w.logit_dim(h >> 1, h & 1, k) == 2 * code_byte + a
                        dims.add(2 * code_byte + a)
    assert dims == set(range(512))


def test_the_value_columns_are_the_dims_the_decoded_nibbles_hold():
    """The operand's permute (0, 3, 4, 1, 2) of [slot, w, r, e, a] makes column n = r + 8 w + 32 a + 64 e."""
    _, _, meaning = _views()["value"]
    for wp in range(4):
        for r in range(8):
            for e in range(8):
                for a in range(2):
                    _, code_byte = meaning((0, wp, r, e))
                    assert w.value_dim(r + 8 * wp + 32 * a + 64 * e) == 2 * code_byte + a
    assert sorted(w.value_dim(n) for n in range(512)) == list(range(512))
    # a lane's 16 columns (r fixed, n = r + 8 w + 32 j within its warp w) are one 16-dim scale block
    assert {w.value_dim(3 + 8 * 2 + 32 * j) // 16 for j in range(16)} == {8 * 2 + 3}


def test_the_rope_columns_are_a_permutation_of_the_rope_dims():
    # the operand's permute (_TO_ROPE_COLUMNS) of [R, c, b3, b2, b1, b0]: column k = b0 + 2 c + 8 b1 + 16 b2 + 32 b3
    assert w._TO_ROPE_COLUMNS.value == (0, 2, 3, 4, 1, 5)
    for c in range(4):
        for b in range(16):
            k = (b & 1) + 2 * c + 8 * ((b >> 1) & 1) + 16 * ((b >> 2) & 1) + 32 * (b >> 3)
            assert w.rope_dim(k) == 16 * c + b


def _permuted(x, shape, order):
    """The kernel's register permutation (reshape, permute, reshape back to ``x``'s rank-2 shape) on a torch tensor."""
    return x.reshape(shape).permute(order).reshape(x.shape[0], -1)


@pytest.mark.parametrize("half", range(8))
def test_each_query_column_meets_the_dim_its_code_column_holds(half):
    """A half's queries are loaded as [heads, 4 runs, 16 consecutive dims] (run c at 128 t + 16 g1 + 32 c) and put in
    column order by the codes' own permutation: column k then holds logit_dim(t, g1, k)."""
    t, g1 = half // 2, half % 2
    loaded = torch.tensor([[128 * t + 16 * g1 + 32 * c + j for c in range(4) for j in range(16)]])
    columns = _permuted(loaded, [1, 4, 2, 2, 2, 2], w._TO_LOGIT_COLUMNS.value)
    assert columns[0].tolist() == [w.logit_dim(t, g1, k) for k in range(64)]


def test_each_rope_query_column_meets_the_rope_dim_its_code_column_holds():
    loaded = torch.arange(64).reshape(1, 64)  # [heads, 4 runs x 16 consecutive dims]: RoPE dim 16 c + b
    columns = _permuted(loaded, [1, 4, 2, 2, 2, 2], w._TO_ROPE_COLUMNS.value)
    assert columns[0].tolist() == [w.rope_dim(k) for k in range(64)]


def test_the_output_columns_are_un_permuted_to_their_dims():
    """Column n of the value accumulator holds dim value_dim(n); the epilogue's permutation puts every dim in place."""
    held = torch.tensor([[w.value_dim(n) for n in range(512)]])
    assert _permuted(held, [1, 8, 2, 4, 8], w._COLUMNS_TO_DIMS.value)[0].tolist() == list(range(512))


def test_the_output_layout_is_the_accumulator_with_its_columns_at_their_dims_and_runs_of_16_dims_first():
    """mma.sync m16n8's accumulator over [16 heads, 512 columns] with the warps along N (PTX ISA): lane l holds columns
    2 (l % 4) + {0, 1} of each 8-column n-tile at rows l // 4 and l // 4 + 8, warp w the n-tiles 4 j + w. _OUT is that
    with each column at its dim (value_dim is linear over the column bits) and the registers reordered so each
    thread's first 16 registers are 16 consecutive dims (16-byte stores)."""
    out = w._OUT.value
    reg = [[0, 1], [8, 0], [0, 32], [0, 64], [0, 128], [0, 256]]
    lane = [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    warp = [[0, 8], [0, 16]]

    def at_dim(basis):
        head, n = basis
        return [head, w.value_dim(n) if n else 0]

    assert out.lane_bases == [at_dim(b) for b in lane]
    assert out.warp_bases == [at_dim(b) for b in warp]
    assert sorted(map(tuple, out.reg_bases)) == sorted(tuple(at_dim(b)) for b in reg)
    assert out.reg_bases[:4] == [[0, 1], [0, 2], [0, 4], [0, 8]]


@pytest.mark.parametrize("name, run", [("_CODES_COPY", 8), ("_ROPE_COPY", 2), ("_SCALE_COPY", 1)])
def test_a_thread_copies_consecutive_slots_so_its_slot_indices_load_as_words(name, run):
    """One tile of a copy layout covers a step's 64 slots once, each thread a run of consecutive slots (a step's slot
    indices are then one 8- or 16-byte load a run, not one 4-byte load a slot), each warp instruction whole records'
    parts (a row of the layout is one slot's bytes of that part)."""
    layout = getattr(w, name).value
    assert layout.order == [1, 0] and layout.size_per_thread == [run, 16]
    assert layout.size_per_thread[0] * layout.threads_per_warp[0] * layout.warps_per_cta[0] == 64
    assert layout.threads_per_warp[1] * 16 == {"_CODES_COPY": 256, "_ROPE_COPY": 64, "_SCALE_COPY": 32}[name]


@pytest.mark.parametrize("launch", ["default", "balanced", "many"])
def test_the_kernel_compiles_for_hopper_without_spilling_two_or_three_programs_a_sm(launch):
    from dsahal.backends.nvidia import aot, config

    default, balanced, many = aot._wgmma_fp4_variants()
    assert default.constexprs["STAGES"] == config.WGMMA_NVFP4["stages"] and default.maxnreg is None
    assert default.constexprs["IN_FLIGHT"] == config.WGMMA_NVFP4["in_flight"]
    assert balanced.constexprs == dict(default.constexprs, BALANCED=True) and not default.constexprs["BALANCED"]
    assert balanced.maxnreg is None
    assert many.constexprs["STAGES"] == config.WGMMA_NVFP4_MANY["stages"]
    assert many.constexprs["IN_FLIGHT"] == config.WGMMA_NVFP4_MANY["in_flight"]
    assert many.maxnreg == config.WGMMA_NVFP4_MANY["maxnreg"]
    programs = 3 if launch == "many" else 2
    assert launch == "many" or programs == config.WGMMA_PROGRAMS_PER_SM  # (the balanced launch's programs a SM)
    result = aot.compile_variant({"default": default, "balanced": balanced, "many": many}[launch])
    assert result.error == "", result.error
    # (the 168-register launch spills a few bytes; with this machine's Triton none in the step loop: the H200's Triton
    # 3.6 puts 3 local loads a step there)
    assert 0 < result.registers <= 255
    assert result.stack_bytes <= {"default": 0, "balanced": 0, "many": 16}[launch]
    assert step_loop_local_memory(result.cubin) == []
    assert programs * result.registers * 128 <= 65536  # programs of 4 warps a SM by registers
    assert programs * (result.shared_bytes + 1024) <= 228 * 1024  # and by shared memory (1 KB reserved a program)


def test_the_launch_by_token_count_in_default_mode_only(monkeypatch):
    """Three programs a SM for large calls, smaller splits for small ones; one launch in batch-invariant mode."""
    from dsahal.backends.nvidia import config, ops

    many = config.WGMMA_NVFP4_MANY
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    assert ops.wgmma_fp4_launch(many["from_tokens"] - 1) == config.WGMMA_NVFP4
    assert ops.wgmma_fp4_launch(many["from_tokens"]) == dict(config.WGMMA_NVFP4, stages=many["stages"],
                                                               maxnreg=many["maxnreg"], in_flight=many["in_flight"])
    # few tokens: smaller splits, each rule below its own token count (in order), the default launch from the last
    (below_small, small), (below_mid, mid) = config.WGMMA_NVFP4_SMALL_SPLITS
    assert below_small < below_mid <= many["from_tokens"] and small < mid < config.WGMMA_NVFP4["split_size"]
    assert ops.wgmma_fp4_launch(1) == dict(config.WGMMA_NVFP4, split_size=small)
    assert ops.wgmma_fp4_launch(below_small - 1) == dict(config.WGMMA_NVFP4, split_size=small)
    assert ops.wgmma_fp4_launch(below_small) == dict(config.WGMMA_NVFP4, split_size=mid)
    assert ops.wgmma_fp4_launch(below_mid) == config.WGMMA_NVFP4
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # one launch whatever the batch
    assert ops.wgmma_fp4_launch(4096) == config.WGMMA_NVFP4
    assert ops.wgmma_fp4_launch(1) == config.WGMMA_NVFP4


def test_the_route_verifier_names_what_the_kernel_does_not_take(monkeypatch):
    from dsahal.backends.nvidia import config, verifiers

    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    slots = torch.zeros(2, 8, dtype=torch.int32)
    ok, reason = verifiers.wgmma_nvfp4_accepts(q, _pages(record=656), slots, "fp8_ds_mla", None, 0.1)
    assert not ok and reason == "fp8_ds_mla latents: the wgmma NVFP4 kernel reads nvfp4 records"
    ok, reason = verifiers.wgmma_nvfp4_accepts(q, _pages(), slots, "nvfp4", None, 0.1)
    assert not ok and reason == "the wgmma NVFP4 kernel runs on NVIDIA CUDA tensors only"
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    monkeypatch.setattr(verifiers, "_capability", lambda index: (10, 0))
    ok, reason = verifiers.wgmma_nvfp4_accepts(q, _pages(), slots, "nvfp4", None, 0.1)
    assert not ok and reason == "sm100: the kernel's wgmma is sm_90 only"
    monkeypatch.setattr(verifiers, "_capability", lambda index: (9, 0))
    for invariant in (False, True):  # every batch size in both modes (a fixed split: batch invariant)
        monkeypatch.setattr(config, "batch_invariant", lambda: invariant)
        assert verifiers.wgmma_nvfp4_accepts(q[:1], _pages(), slots[:1], "nvfp4", None, 0.1) == (True, "")
        most = config.WGMMA_GROUPED_MAX_HEADS  # groups of 16 heads up to the configured count
        for heads, want in ((most, (True, "")), (most + 1, (False, f"{most + 1} heads: the route takes at most "
                                                                   f"{most} (groups of 16)"))):
            wide = torch.zeros(1, heads, 576, dtype=torch.bfloat16)
            assert verifiers.wgmma_nvfp4_accepts(wide, _pages(), slots[:1], "nvfp4", None, 0.1) == want


def test_the_launcher_passes_each_kernel_parameter_by_its_name(monkeypatch):
    from dsahal.backends.triton_kernels.sparse_mla import LOG2E
    from dsahal.kernel_launch import triton_launch

    names = triton_launch(w.sparse_mla_wgmma_fp4_kernel).arg_names
    recorder = LaunchRecorder()
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    monkeypatch.setattr(w, "sparse_mla_wgmma_fp4_kernel", recorder)
    from dsahal.backends.triton_kernels import sparse_mla_gluon

    # (the splits' merge is a Triton kernel of its own: its inputs stand in for it)
    monkeypatch.setattr(sparse_mla_gluon, "lse_combine", lambda o, lse, out_dtype: (o[0].to(out_dtype), lse[0]))
    q = torch.zeros(3, 24, 576, dtype=torch.bfloat16)
    pages = torch.zeros(4, 64, 352, dtype=torch.uint8)
    slots = torch.zeros(3, 300, dtype=torch.int32)
    o, lse = w.sparse_mla_wgmma_fp4(q, pages, slots, "nvfp4", None, 0.25, split_size=128, stages=4)
    assert o.shape == (3, 24, 512) and lse.shape == (3, 24)
    ((grid, args, kwargs),) = recorder.calls
    assert grid == (3, 3, 2)  # three splits, three tokens, two groups of 16 heads
    bound = dict(zip(names, args), **kwargs)
    assert set(names) <= set(bound) and len(args) == names.index("parts") + 1  # (the balanced schedule's sizes last)
    assert (bound["tokens"], bound["parts"], bound["BALANCED"]) == (3, 3, False)  # (three splits: three parts)
    assert (bound["H"], bound["K"], bound["num_slots"], bound["block_tokens"], bound["split_size"]) == (24, 300, 256,
                                                                                                          64, 128)
    assert bound["logit_scale"] == pytest.approx(0.25 * LOG2E)
    assert (bound["s8_b"], bound["s8_t"], bound["FLAT"], bound["OFF32"], bound["STAGES"]) == (64 * 352, 352, True,
                                                                                               True, 4)
