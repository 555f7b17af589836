"""The wgmma few-heads sparse MLA kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_wgmma`) on a CPU machine.

Gluon has no interpreter, so its results are checked on the H200 only (``scripts/h200/wgmma_mla_check.py`` against the
float64 reference on the edge cases and at the serving shape, the conformance suite through the route). Here: what
the launcher serves and refuses (naming the op, the argument, what was expected and what was given), the value
operand's view of the swizzled codes (its offset bases against the 128-byte swizzle and the output's dim
permutation), that the kernel compiles for sm_90 with the local Triton without spilling and with two programs a SM,
and what the route's verifier says.
"""
from __future__ import annotations

import re

import pytest
import torch
from launch_recorder import LaunchRecorder

from dsahal.backends.triton_kernels import sparse_mla_wgmma as w


def _pages(blocks=4, block_tokens=16, device="cpu", record=656):
    return torch.zeros(blocks, block_tokens, record, dtype=torch.uint8, device=device)


def test_serves_bf16_queries_of_at_most_16_heads_on_aligned_fp8_ds_mla_pages_on_a_cuda_device_only():
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    assert w.refusal(q, _pages(), "fp8_ds_mla") == "the wgmma few-heads kernel runs on NVIDIA CUDA tensors only"
    meta = torch.empty(2, 16, 576, dtype=torch.bfloat16, device="meta")
    assert not w.serves(meta, _pages(device="meta"), "fp8_ds_mla")
    assert w.refusal(q, _pages(), "nvfp4") == (
        "nvfp4 latents: the wgmma few-heads kernel reads fp8_ds_mla or fp8 records")
    # per-tensor FP8 records (576 bytes) too; each format's own record size
    assert w.refusal(q, _pages(record=576), "fp8") == "the wgmma few-heads kernel runs on NVIDIA CUDA tensors only"
    from dsahal.backends.triton_kernels import sparse_mla_gluon

    with pytest.MonkeyPatch.context() as patch:  # past the device check: the record size
        patch.setattr(sparse_mla_gluon, "runs_ptx", lambda device: True)
        assert w.refusal(q, _pages(), "fp8") == (
            "pages torch.uint8 [4, 16, 656]: the wgmma few-heads kernel reads uint8 [blocks, tokens, 576]")
        assert w.refusal(q, _pages(record=576), "fp8_ds_mla") == (
            "pages torch.uint8 [4, 16, 576]: the wgmma few-heads kernel reads uint8 [blocks, tokens, 656]")
    assert w.refusal(q.float(), _pages(), "fp8_ds_mla") == "float32 queries: the wgmma few-heads kernel takes bf16"
    # any head count (groups of 16): 17 or 128 heads pass the shape check, a query of 512 dims does not
    for heads in (17, 128):
        assert w.refusal(torch.zeros(2, heads, 576, dtype=torch.bfloat16), _pages(), "fp8_ds_mla") == (
            "the wgmma few-heads kernel runs on NVIDIA CUDA tensors only")
    assert w.refusal(torch.zeros(2, 16, 512, dtype=torch.bfloat16), _pages(), "fp8_ds_mla") == (
        "q of shape [2, 16, 512]: the wgmma few-heads kernel takes [T, H, 576]")


def test_a_call_it_does_not_serve_raises_naming_the_op_and_what_it_got():
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"triton sparse_mla_wgmma: expected bf16 q .* got q torch.bfloat16 "
                                         r"\[2, 16, 576\] on cpu"):
        w.sparse_mla_wgmma(q, _pages(), torch.zeros(2, 8, dtype=torch.int32), "fp8_ds_mla", None, 0.1)


@pytest.mark.parametrize("kwargs, message", [(dict(stages=1), "stages expected 2 or 3, got 1"),
                                             (dict(stages=4), "stages expected 2 or 3, got 4"),
                                             (dict(split_size=0), "split_size expected None or >= 1, got 0")])
def test_launch_parameters_are_checked_before_any_launch(monkeypatch, kwargs, message):
    monkeypatch.setattr(w, "refusal", lambda *args: "")  # past the device check: the parameters' own
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"triton sparse_mla_wgmma: {message}"):
        w.sparse_mla_wgmma(q, _pages(), torch.zeros(2, 8, dtype=torch.int32), "fp8_ds_mla", None, 0.1, **kwargs)


def _index(bases, offset):
    """A linear layout's index for ``offset``: the XOR of the bases of its set bits."""
    index = [0, 0, 0]
    for bit, basis in enumerate(bases):
        if offset >> bit & 1:
            index = [a ^ b for a, b in zip(index, basis)]
    return tuple(index)


def test_the_value_view_reads_each_swizzled_code_once_at_the_dim_the_output_stores():
    bases = [list(b) for b in w._VALUE_BASES.value]
    seen = set()
    for offset in range(4 * 64 * 128):  # a stage's codes: [tile, slot, 128 bytes], rows swizzled in 16-byte pieces
        part, slot, n = _index(bases, offset)
        assert 0 <= part < 4 and 0 <= slot < 64 and 0 <= n < 128
        dim = w.value_dim(n)
        # the 128-byte swizzle: a slot's 16-byte piece p of its row sits at piece p ^ (slot % 8)
        assert offset == part * 8192 + slot * 128 + ((dim >> 4) ^ (slot % 8)) * 16 + (dim & 15), (offset, part, slot, n)
        seen.add((part, slot, n))
    assert len(seen) == 4 * 64 * 128
    assert sorted(w.value_dim(n) for n in range(128)) == list(range(128))


def _index4(bases, offset):
    index = [0, 0, 0, 0]
    for bit, basis in enumerate(bases):
        if offset >> bit & 1:
            index = [a ^ b for a, b in zip(index, basis)]
    return tuple(index)


def test_the_chunk_view_reads_each_swizzled_code_once_where_the_swizzle_put_it():
    """Chunk 2 t + h of a stage is the 16-byte pieces 2 c + h of tile t's 64 slots: view index [chunk, slot, c, j] is
    byte j of piece (2 c + h) ^ (slot % 8) of the slot's 128-byte row (the 128-byte swizzle), tiles 8 KB apart."""
    bases = [list(b) for b in w._CHUNK_BASES.value]
    seen = set()
    for offset in range(4 * 64 * 128):
        chunk, slot, c, j = _index4(bases, offset)
        assert 0 <= chunk < 8 and 0 <= slot < 64 and 0 <= c < 4 and 0 <= j < 16
        t, h = chunk >> 1, chunk & 1
        assert offset == t * 8192 + slot * 128 + 16 * ((2 * c + h) ^ (slot % 8)) + j, (offset, chunk, slot, c, j)
        seen.add((chunk, slot, c, j))
    assert len(seen) == 4 * 64 * 128


def test_the_fp8_rope_view_is_row_major():
    bases = [list(b) for b in w._ROPE8_BASES.value]
    for offset in range(64 * 64):
        _, slot, c, j = _index4(bases, offset)
        assert offset == slot * 64 + 16 * c + j


def _held(layout, reg, lane, warp):
    index = [0] * len(layout.shape)
    for bases, value in ((layout.reg_bases, reg), (layout.lane_bases, lane), (layout.warp_bases, warp)):
        for bit, basis in enumerate(bases):
            if value >> bit & 1:
                index = [a ^ b for a, b in zip(index, basis)]
    return index


def test_a_chunk_is_loaded_as_the_fp16_wgmma_register_a_fragment_with_its_columns_permuted():
    """The wgmma's register A operand (fp16, PTX ISA: each warp's 16 rows as mma.m16n8k16's A fragment) gives lane l of
    warp w the rows 16 w + l // 4 and + 8, and in each 16-column block the columns 2 (l % 4) + {0, 1} and + 8. The load
    gives the thread its 16 consecutive bytes j of piece c = l % 4 of those two slots: byte j = e + 2 hh + 4 b is
    column k = e + 2 c + 8 hh + 16 b, one of the fragment's columns."""
    load = w._CHUNK_LOAD.value
    assert load.shape == [1, 64, 4, 16]
    for warp in range(4):
        for lane in range(32):
            held = {tuple(_held(load, reg, lane, warp)) for reg in range(32)}
            assert len(held) == 32
            for _, slot, c, j in held:
                assert slot // 16 == warp and slot % 8 == lane // 4 and c == lane % 4
                e, hh, b = j & 1, (j >> 1) & 1, j >> 2
                k = e + 2 * c + 8 * hh + 16 * b
                assert (k % 8) // 2 == lane % 4  # a column of the lane's fragment
            assert {j for _, _, _, j in held} == set(range(16))


def _columns(x):
    """The kernel's register permutation into column order (reshape, _TO_COLUMNS, reshape) on ``x [rows, 4, 16]``."""
    return x.reshape(x.shape[0], 4, 4, 2, 2).permute(w._TO_COLUMNS.value).reshape(x.shape[0], 64)


@pytest.mark.parametrize("chunk", range(8))
def test_each_query_column_meets_the_code_column_of_its_dim(chunk):
    """A chunk's codes (piece 2 c + h, byte j: dim 128 t + 16 (2 c + h) + j) and its queries (runs at 128 t + 16 h +
    32 c, :func:`_query_runs`) go through the same permutation: column k of both holds logit_dim(chunk, k)."""
    t, h = chunk >> 1, chunk & 1
    code_dims = torch.tensor([[128 * t + 16 * (2 * c + h) + j for c in range(4) for j in range(16)]]).reshape(1, 4, 16)
    query_dims = torch.tensor([[128 * t + 16 * h + 32 * c + j for c in range(4) for j in range(16)]]).reshape(1, 4, 16)
    want = [w.logit_dim(chunk, k) for k in range(64)]
    assert _columns(code_dims)[0].tolist() == want and _columns(query_dims)[0].tolist() == want
    assert sorted(d for ch in range(8) for d in (w.logit_dim(ch, k) for k in range(64))) == list(range(512))


def test_a_lane_reads_the_four_n_tiles_of_a_32_bit_word_in_register_order():
    load = w._LOAD.value
    # registers 0 and 1 of the load layout are n + 8 and n + 16: four consecutive bytes of one slot's row
    assert load.reg_bases[0] == [0, 0, 8] and load.reg_bases[1] == [0, 0, 16]
    assert [w.value_dim(n) for n in (0, 8, 16, 24)] == [0, 1, 2, 3]
    assert [w.value_dim(n) for n in (5, 13, 21, 29)] == [20, 21, 22, 23]


def _first_register(layout, warp=0):
    """The element each lane of ``warp`` holds in its first register (a ``BlockedLayout``: lanes and warps laid over
    the dims fastest-first in ``order``), lane by lane."""
    def split(index, counts):
        coord = [0] * len(counts)
        for dim in layout.order:
            coord[dim] = index % counts[dim]
            index //= counts[dim]
        return coord

    warp_coord = split(warp, layout.warps_per_cta)
    out = []
    for lane in range(32):
        lane_coord = split(lane, layout.threads_per_warp)
        out.append(tuple(layout.size_per_thread[d] * (lane_coord[d] + layout.threads_per_warp[d] * warp_coord[d])
                         for d in range(len(layout.order))))
    return out


@pytest.mark.parametrize("warp", range(4))
def test_each_copy_instruction_covers_whole_records(warp):
    """A record is 656 bytes: every other one starts 16 bytes into a 32-byte sector, so a copy instruction covering
    part of a record leaves its sectors at the cut to another instruction, and the L2 serves them twice."""
    codes = _first_register(w._CODES_COPY.value, warp)  # [part, slot, byte] of [4, 64, 128], 16 bytes a lane
    assert len({slot for _, slot, _ in codes}) == 1
    assert sorted(part * 128 + byte for part, _, byte in codes) == list(range(0, 512, 16))
    rope = _first_register(w._ROPE_COPY.value, warp)  # [slot, dim] of [64, 64] bf16, 8 dims (16 bytes) a lane
    slots = {slot for slot, _ in rope}
    assert len(slots) == 4 and all(sorted(d for s, d in rope if s == slot) == list(range(0, 64, 8)) for slot in slots)
    scales = _first_register(w._SCALE_COPY.value, warp)  # [part, slot] of [4, 64] fp32
    slots = {slot for _, slot in scales}
    assert len(slots) == 8 and all(sorted(p for p, s in scales if s == slot) == [0, 1, 2, 3] for slot in slots)
    # and the instructions of a step cover its 64 slots: 16 code copies a thread (registers), 4 warps
    assert w._CODES_COPY.value.warps_per_cta == [1, 4, 1]


@pytest.mark.parametrize("name, slot_dim", [("_CODES_COPY", 1), ("_ROPE_COPY", 0), ("_SCALE_COPY", 1),
                                            ("_ROPE8_COPY", 0)])
def test_a_thread_copies_consecutive_slots_so_its_slot_indices_load_as_words(name, slot_dim):
    """One tile of the copy layout covers a step's 64 slots once, each thread a run of consecutive slots (the slot
    indices of a step are then one 8- or 16-byte load a run, not one 4-byte load a slot)."""
    layout = getattr(w, name).value
    assert (layout.size_per_thread[slot_dim] * layout.threads_per_warp[slot_dim]
            * layout.warps_per_cta[slot_dim]) == 64
    assert layout.size_per_thread[slot_dim] >= 2


def _accumulator_bases():
    """mma.sync m16n8's accumulator over [4 parts, 16 heads, 128 columns] with a warp a part (PTX ISA): lane l holds
    columns 2 (l % 4) + {0, 1} of each 8-column n-tile at rows l // 4 and l // 4 + 8; the n-tiles are registers."""
    reg = [[0, 0, 1], [0, 8, 0], [0, 0, 8], [0, 0, 16], [0, 0, 32], [0, 0, 64]]
    lane = [[0, 0, 2], [0, 0, 4], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
    warp = [[1, 0, 0], [2, 0, 0]]
    return reg, lane, warp


def test_the_output_layout_is_the_accumulator_with_its_columns_at_their_dims_and_runs_of_8_dims_first():
    """The epilogue un-permutes the value columns (column n holds dim value_dim(n)) by reshape and permute, then takes
    the _OUT layout: the same lanes and warps (no data moves), the registers reordered so each thread's first 8
    registers are 8 consecutive dims (16-byte stores)."""
    out = w._OUT.value

    def at_dim(basis):
        part, head, n = basis
        return [part, head, w.value_dim(n) if n else 0]

    reg, lane, warp = _accumulator_bases()
    assert out.lane_bases == [at_dim(b) for b in lane]
    assert out.warp_bases == [at_dim(b) for b in warp]
    assert sorted(map(tuple, out.reg_bases)) == sorted(tuple(at_dim(b)) for b in reg)
    assert out.reg_bases[:3] == [[0, 0, 1], [0, 0, 2], [0, 0, 4]]


def test_every_warp_holds_a_steps_tile_scales_whole():
    """A step's largest scale per tile is reduced by each warp alone: the layout's warps hold the same elements and
    its registers and lanes cover the [4, 64] scales once."""
    layout = w._SCALES_ALL.value
    assert layout.warp_bases == [[0, 0], [0, 0]] and layout.shape == [4, 64]
    held = {(0, 0)}
    for basis in layout.reg_bases + layout.lane_bases:
        held |= {(p ^ basis[0], s ^ basis[1]) for p, s in held}
    assert held == {(p, s) for p in range(4) for s in range(64)}


def step_loop_local_memory(cubin) -> list[str]:
    """The local-memory (spill) instructions of a kernel's step loop: the smallest loop that holds MMAs (the balanced
    kernels run it inside their loop over pieces)."""
    return loop_local_memory(cubin, "MMA")


def loop_local_memory(cubin, holding: str) -> list[str]:
    """The local-memory (spill) instructions of the smallest loop (a region a backward branch closes) holding an
    instruction whose opcode contains ``holding``."""
    from dsahal.backends.nvidia import sass

    instructions = sass.parse_sass(sass.cuobjdump(cubin, "-sass"))
    loops = []
    for ins in instructions:
        target = re.search(r"0x([0-9a-f]+)\s*$", ins.operands) if ins.opcode.startswith("BRA") else None
        if target and int(target.group(1), 16) < ins.address:
            region = [i for i in instructions if int(target.group(1), 16) <= i.address <= ins.address]
            if any(holding in i.opcode for i in region):
                loops.append(region)
    assert loops, f"no loop holding {holding}"
    return [f"{i.opcode} {i.operands}" for i in min(loops, key=len) if i.opcode.startswith(("LDL", "STL"))]


@pytest.mark.parametrize("ws", [True, False])
@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8"])
def test_the_kernel_compiles_for_hopper_without_spilling_two_programs_a_sm(fmt, balanced, ws):
    """The backend's launch (with its producer warpgroup, ``config.WGMMA_FEW_HEADS``), on either record format, with
    fixed splits and on the balanced schedule (whose loop over pieces may keep its few piece bounds in local memory:
    never the step loops), and the launch without the producer where aot compiles it (balanced fp8_ds_mla)."""
    from dsahal.backends.nvidia import aot, config

    assert config.WGMMA_FEW_HEADS["ws"]
    found = [v for v in aot._wgmma_variants() if v.constexprs["FP8"] == (fmt == "fp8")
             and v.constexprs["BALANCED"] == balanced and v.constexprs["WS"] == ws]
    if not ws and (fmt, balanced) != ("fp8_ds_mla", True):
        assert found == []
        return
    (variant,) = found
    result = aot.compile_variant(variant)
    assert result.error == "", result.error
    assert result.stack_bytes <= (64 if balanced else 0)
    # the step loop: no spill stored there; with the producer on the balanced schedule (the computing warpgroup at 216
    # registers) one value is reloaded a step from local memory (an L1 hit; 1-3% faster than at 224, H100)
    spills = step_loop_local_memory(result.cubin)
    assert not any(s.startswith("STL") for s in spills) and len(spills) <= (1 if ws and balanced else 0), spills
    if ws:  # 8 warps under a launch cap of 128 registers (setmaxnreg hands the computing warpgroup 256 - producer's)
        assert result.registers == 128 and variant.maxnreg == 128
        spills = loop_local_memory(result.cubin, "LDGSTS")  # the producer's step loop: at most its piece's bounds
        assert not any(s.startswith("STL") for s in spills) and len(spills) <= (2 if balanced else 0), spills
        assert 2 * result.registers * 256 <= 65536  # two programs a SM by registers
    else:
        assert 0 < result.registers <= 255
        assert 2 * result.registers * 128 <= 65536  # two programs of 4 warps a SM by registers
    assert 2 * (result.shared_bytes + 1024) <= 228 * 1024  # and by shared memory (1 KB reserved a program)


def test_the_route_verifier_names_what_the_kernel_does_not_take(monkeypatch):
    from dsahal.backends.nvidia import config, verifiers

    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    slots = torch.zeros(2, 8, dtype=torch.int32)
    ok, reason = verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "nvfp4", None, 0.1)
    assert not ok and reason == "nvfp4 latents: the wgmma few-heads kernel reads fp8_ds_mla or fp8 records"
    ok, reason = verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1)
    assert not ok and reason == "the wgmma few-heads kernel runs on NVIDIA CUDA tensors only"
    # past the launcher's own checks: the architecture, then the batch size in default mode only
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    monkeypatch.setattr(verifiers, "_capability", lambda index: (10, 0))
    ok, reason = verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1)
    assert not ok and reason == "sm100: the kernel's wgmma is sm_90 only"
    monkeypatch.setattr(verifiers, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    # below the token threshold: left to FlashMLA's decode only where it is available and takes the call
    monkeypatch.setattr(verifiers, "_flashmla_loads", lambda: True)
    monkeypatch.setattr(verifiers.flashmla, "decode_accepts", lambda *args: (True, ""))
    ok, reason = verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1)
    assert not ok and re.fullmatch(rf"2 query tokens: below {config.WGMMA_MIN_TOKENS}, FlashMLA's decode .*", reason)
    monkeypatch.setattr(verifiers.flashmla, "decode_accepts", lambda *args: (False, "pages of 16 tokens"))
    assert verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1) == (True, "")
    monkeypatch.setattr(verifiers.flashmla, "decode_accepts", lambda *args: (True, ""))
    monkeypatch.setattr(verifiers, "_flashmla_loads", lambda: False)  # no sgl-flash-mla: this kernel serves
    assert verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1) == (True, "")
    monkeypatch.setattr(verifiers, "_flashmla_loads", lambda: True)
    big = torch.zeros(config.WGMMA_MIN_TOKENS, 16, 576, dtype=torch.bfloat16)
    assert verifiers.wgmma_few_heads_accepts(big, _pages(), slots, "fp8_ds_mla", None, 0.1) == (True, "")
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # every batch: the route must not depend on it
    assert verifiers.wgmma_few_heads_accepts(q, _pages(), slots, "fp8_ds_mla", None, 0.1) == (True, "")
    # past each format's head limit (the kernel's groups): not routed (config.WGMMA_ROUTE_MAX_HEADS), whatever the
    # mode and whether FlashMLA loads; per-tensor FP8 records (which FlashMLA does not read) up to theirs
    scale = torch.tensor(1.0)
    for invariant, loads in ((True, True), (False, True), (False, False)):
        monkeypatch.setattr(config, "batch_invariant", lambda: invariant)
        monkeypatch.setattr(verifiers, "_flashmla_loads", lambda: loads)
        for fmt, record in (("fp8_ds_mla", 656), ("fp8", 576)):
            most = config.WGMMA_ROUTE_MAX_HEADS[fmt]
            at_most = torch.zeros(config.WGMMA_MIN_TOKENS, most, 576, dtype=torch.bfloat16)
            wide = torch.zeros(config.WGMMA_MIN_TOKENS, most + 1, 576, dtype=torch.bfloat16)
            given = scale if fmt == "fp8" else None
            assert verifiers.wgmma_few_heads_accepts(at_most, _pages(record=record), slots, fmt, given, 0.1) == (
                True, "")
            assert verifiers.wgmma_few_heads_accepts(wide, _pages(record=record), slots, fmt, given, 0.1) == (
                False, f"{most + 1} heads: the route takes at most {most} with {fmt} latents "
                       f"(config.WGMMA_ROUTE_MAX_HEADS)")
    assert config.WGMMA_ROUTE_MAX_HEADS["fp8_ds_mla"] == 16  # past it, FlashMLA's decode (heads padded) is faster


@pytest.mark.parametrize("module_name, launcher, kernel_name, extra", [
    ("sparse_mla_wgmma", "sparse_mla_wgmma", "sparse_mla_wgmma_kernel", dict(STAGES=2)),
    ("sparse_mla_gluon", "sparse_mla_gluon", "sparse_mla_gluon_kernel", dict(BLOCK_N=16, STAGES=4, SPLIT=1))])
def test_the_launchers_pass_each_kernel_parameter_by_its_name(monkeypatch, module_name, launcher, kernel_name, extra):
    """Both few-heads Gluon launchers go through ``launch_over_tokens``: every value lands on the kernel parameter of
    its name (the kernels cannot run here: a recorder takes the launch)."""
    import importlib

    from dsahal.backends.triton_kernels.sparse_mla import LOG2E
    from dsahal.kernel_launch import triton_launch

    module = importlib.import_module(f"dsahal.backends.triton_kernels.{module_name}")
    names = triton_launch(getattr(module, kernel_name)).arg_names
    recorder = LaunchRecorder()
    monkeypatch.setattr(module, "refusal", lambda *args: "")
    monkeypatch.setattr(module, kernel_name, recorder)
    heads = 40 if module_name == "sparse_mla_wgmma" else 12  # the wgmma kernel: three groups of 16 heads
    q = torch.zeros(3, heads, 576, dtype=torch.bfloat16)
    pages = torch.zeros(4, 64, 656, dtype=torch.uint8)
    slots = torch.zeros(3, 300, dtype=torch.int32)
    o, lse = getattr(module, launcher)(q, pages, slots, "fp8_ds_mla", None, 0.25, split_size=None)
    assert o.shape == (3, heads, 512) and lse.shape == (3, heads)
    ((grid, args, kwargs),) = recorder.calls
    assert grid == (1, 3, 3 if heads == 40 else 1)  # one split, three tokens, the head groups
    bound = dict(zip(names, args), **kwargs)
    # every run-time argument by position (the wgmma kernel's tensor scale after the logit scale, then the balanced
    # schedule's sizes: last, so the fixed launch's parameters keep their places)
    last = "parts" if "parts" in names else "logit_scale"
    assert set(names) <= set(bound) and len(args) == names.index(last) + 1
    assert (bound["H"], bound["K"], bound["num_slots"], bound["block_tokens"], bound["split_size"]) == (heads, 300,
                                                                                                          256, 64, 300)
    if module_name == "sparse_mla_wgmma":  # (the balanced schedule's sizes: unused by a fixed launch)
        assert (bound["tokens"], bound["parts"], bound["BALANCED"], bound["WS"]) == (3, 1, False, False)
        assert "maxnreg" not in bound
        # with the producer warpgroup: its registers, and the launch capped at 128 (two programs of 8 warps a SM)
        getattr(module, launcher)(q, pages, slots, "fp8_ds_mla", None, 0.25, split_size=None, ws=True,
                                  producer_regs=40)
        ws_bound = dict(zip(names, recorder.calls[1][1]), **recorder.calls[1][2])
        assert (ws_bound["WS"], ws_bound["PRODUCER_REGS"], ws_bound["maxnreg"]) == (True, 40, 128)
        with pytest.raises(ValueError, match="ws .the producer warpgroup. expected stages=2, got stages=3"):
            getattr(module, launcher)(q, pages, slots, "fp8_ds_mla", None, 0.25, ws=True, stages=3)
        for bad in (16, 44, 136, 40.0):
            with pytest.raises(ValueError, match=rf"producer_regs expected a multiple of 8 in 24..128 .*got {bad}"):
                getattr(module, launcher)(q, pages, slots, "fp8_ds_mla", None, 0.25, ws=True, producer_regs=bad)
    assert bound["logit_scale"] == pytest.approx(0.25 * LOG2E)
    assert (bound["s8_b"], bound["s8_t"], bound["FLAT"], bound["OFF32"]) == (64 * 656, 656, True, True)
    assert (bound["stride_qt"], bound["stride_st"], bound["stride_ot"]) == (heads * 576, 300, heads * 512)
    assert all(bound[name] == value for name, value in extra.items())


def test_fp8_records_pass_their_tensor_scale_to_the_kernel_and_a_bad_one_is_refused(monkeypatch):
    from dsahal.kernel_launch import triton_launch

    names = triton_launch(w.sparse_mla_wgmma_kernel).arg_names
    recorder = LaunchRecorder()
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    monkeypatch.setattr(w, "sparse_mla_wgmma_kernel", recorder)
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    pages = torch.zeros(4, 64, 576, dtype=torch.uint8)
    slots = torch.zeros(3, 300, dtype=torch.int32)
    scale = torch.tensor(0.25)
    w.sparse_mla_wgmma(q, pages, slots, "fp8", scale, 0.25, split_size=None)
    ((grid, args, kwargs),) = recorder.calls
    bound = dict(zip(names, args), **kwargs)
    assert bound["FP8"] is True and bound["kv_scale_ptr"].data_ptr() == scale.data_ptr()
    assert bound["kv_scale_ptr"].shape == () and bound["s8_t"] == 576
    w.sparse_mla_wgmma(q, _pages(record=656), slots, "fp8_ds_mla", None, 0.25, split_size=None)
    assert recorder.calls[1][2]["FP8"] is False
    for bad, got in ((None, "NoneType"), (torch.tensor([0.25, 0.5]), "torch.float32 [2] on cpu"),
                     (torch.tensor(1, dtype=torch.int32), "torch.int32 [] on cpu")):
        with pytest.raises(ValueError, match=rf"triton sparse_mla_wgmma: kv_scale expected a float32 tensor of one "
                                             rf"element on cpu for fp8 latents, got {re.escape(got)}"):
            w.sparse_mla_wgmma(q, pages, slots, "fp8", bad, 0.25, split_size=None)


def test_the_launch_takes_smaller_splits_below_the_token_count_in_default_mode_only(monkeypatch):
    from dsahal.backends.nvidia import config, ops

    tiers = config.WGMMA_SMALL_SPLITS
    assert config.WGMMA_MIN_TOKENS < tiers[0][0]  # the route's smallest calls are the ones split smallest
    assert [below for below, _ in tiers] == sorted(below for below, _ in tiers)
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    for below, split_size in tiers:
        assert ops.wgmma_launch(below - 1) == dict(config.WGMMA_FEW_HEADS, split_size=split_size)
    assert ops.wgmma_launch(config.WGMMA_MIN_TOKENS) == dict(config.WGMMA_FEW_HEADS, split_size=tiers[0][1])
    assert ops.wgmma_launch(tiers[-1][0]) == config.WGMMA_FEW_HEADS
    assert ops.wgmma_launch(320) == config.WGMMA_FEW_HEADS
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # a fixed split whatever the batch
    assert ops.wgmma_launch(tiers[-1][0] - 1) == config.WGMMA_FEW_HEADS
    assert ops.wgmma_launch(1) == config.WGMMA_FEW_HEADS


@pytest.mark.parametrize("module_name, launcher, kernel_name, record", [
    ("sparse_mla_wgmma", "sparse_mla_wgmma", "sparse_mla_wgmma_kernel", 656),
    ("sparse_mla_wgmma_fp4", "sparse_mla_wgmma_fp4", "sparse_mla_wgmma_fp4_kernel", 352)])
@pytest.mark.parametrize("heads, programs", [(16, 264), (40, 264), (12, 5), (16, 10_000)])
def test_a_balanced_launch_runs_its_programs_over_the_calls_steps(monkeypatch, module_name, launcher, kernel_name,
                                                                  record, heads, programs):
    """``programs`` in all, divided among the head groups (never more a group than the call's steps), one grid row,
    ``BALANCED`` set; the partials sized by the schedule's parts bound and merged (a recorder takes the launch: the
    kernels cannot run here)."""
    import importlib

    from dsahal.backends.triton_kernels import balanced
    from dsahal.kernel_launch import triton_launch

    from dsahal.backends.triton_kernels import sparse_mla_gluon

    module = importlib.import_module(f"dsahal.backends.triton_kernels.{module_name}")
    names = triton_launch(getattr(module, kernel_name)).arg_names
    recorder = LaunchRecorder()
    monkeypatch.setattr(module, "refusal", lambda *args: "")
    monkeypatch.setattr(module, kernel_name, recorder)
    merged = []
    monkeypatch.setattr(sparse_mla_gluon, "lse_combine", lambda o, lse, out_dtype: merged.append(o.shape) or (
        o[0].to(out_dtype), lse[0]))
    q = torch.zeros(37, heads, 576, dtype=torch.bfloat16)
    slots = torch.zeros(37, 2000, dtype=torch.int32)
    fmt = "fp8_ds_mla" if record == 656 else "nvfp4"
    # (split_size None: one split a row for a fixed launch, unread by a balanced one)
    o, lse = getattr(module, launcher)(q, _pages(record=record), slots, fmt, None, 0.25, programs=programs,
                                       split_size=None)
    assert o.shape == (37, heads, 512) and lse.shape == (37, heads) and o.dtype == torch.bfloat16
    ((grid, args, kwargs),) = recorder.calls
    groups = -(-heads // 16)
    per_group = max(1, programs // groups)
    assert grid == (balanced.launch_programs(37, 2000, per_group), 1, groups)
    bound = dict(zip(names, args), **kwargs)
    assert bound["BALANCED"] is True and bound["tokens"] == 37
    assert bound["parts"] == balanced.parts_bound(37, 2000, per_group) == bound["o_ptr"].shape[0]
    assert bound["lse_ptr"].shape == (bound["parts"], 37, heads) and bound["o_ptr"].dtype == torch.float32
    assert merged == [bound["o_ptr"].shape]


@pytest.mark.parametrize("programs", [0, -3, 2.5, True, "264"])
def test_a_bad_program_count_is_refused_naming_it(monkeypatch, programs):
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"triton sparse_mla_wgmma: programs expected None or an int >= 1, got "
                                         rf"{re.escape(repr(programs))}"):
        w.sparse_mla_wgmma(q, _pages(), torch.zeros(3, 300, dtype=torch.int32), "fp8_ds_mla", None, 0.25,
                           programs=programs)


def test_default_mode_takes_the_balanced_schedule_from_its_token_count(monkeypatch):
    """From ``config.WGMMA_BALANCED_FROM_TOKENS[format]`` tokens, ``config.WGMMA_PROGRAMS_PER_SM`` programs a SM of
    the call's device; fixed splits below it, for a format it does not name, in batch-invariant mode and without a
    device."""
    from dsahal.backends.nvidia import config, ops

    monkeypatch.setattr(ops, "_multiprocessors", lambda device: 132)
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    programs = config.WGMMA_PROGRAMS_PER_SM * 132
    for fmt, launch, base, small_splits in (
            ("fp8_ds_mla", ops.wgmma_launch, config.WGMMA_FEW_HEADS, config.WGMMA_SMALL_SPLITS),
            ("fp8", lambda n, device: ops.wgmma_launch(n, device, "fp8"), config.WGMMA_FEW_HEADS,
             config.WGMMA_SMALL_SPLITS),
            ("nvfp4", ops.wgmma_fp4_launch, config.WGMMA_NVFP4, config.WGMMA_NVFP4_SMALL_SPLITS)):
        start = config.WGMMA_BALANCED_FROM_TOKENS[fmt]
        assert start >= small_splits[-1][0]  # the small splits' calls keep them
        assert launch(start, "cuda") == dict(base, programs=programs)
        assert launch(4096, "cuda") == dict(base, programs=programs)
        assert "programs" not in launch(start - 1, "cuda")
        assert "programs" not in launch(4096, None)  # (no device: fixed splits)
    below = config.WGMMA_BALANCED_FROM_TOKENS["fp8_ds_mla"] - 1
    assert ops.wgmma_launch(below, "cuda") == ops.wgmma_launch(below)  # the fixed rule below it
    # a format the table does not name never takes it (per-tensor FP8: not yet timed on it)
    monkeypatch.setattr(config, "WGMMA_BALANCED_FROM_TOKENS", {"fp8_ds_mla": 64})
    assert ops.wgmma_launch(320, "cuda", "fp8") == config.WGMMA_FEW_HEADS
    assert ops.wgmma_launch(320, "cuda", "fp8_ds_mla") == dict(config.WGMMA_FEW_HEADS, programs=programs)
    many = config.WGMMA_NVFP4_MANY  # NVFP4 without it: the three-programs launch for large calls, as before
    assert ops.wgmma_fp4_launch(many["from_tokens"], "cuda") == dict(
        config.WGMMA_NVFP4, stages=many["stages"], maxnreg=many["maxnreg"], in_flight=many["in_flight"])
    monkeypatch.setattr(config, "WGMMA_BALANCED_FROM_TOKENS", {"fp8_ds_mla": 1, "fp8": 1, "nvfp4": 1})
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # fixed splits: a row's sums never follow its batch
    assert ops.wgmma_launch(320, "cuda") == config.WGMMA_FEW_HEADS
    assert ops.wgmma_launch(320, "cuda", "fp8") == config.WGMMA_FEW_HEADS
    assert ops.wgmma_fp4_launch(320, "cuda") == config.WGMMA_NVFP4


def test_the_producer_launch_needs_gluons_warp_specialize_form(monkeypatch):
    """This Triton (CI's) has the form the producer launch is written in. A Triton without it: an explicit ``ws=True``
    is refused by name, and the route (``ops.sparse_mla_wgmma``) runs the launch without the producer instead (the
    same results bit for bit), never a compile error mid-serving."""
    from dsahal.backends.nvidia import config, ops

    assert w.producer_refusal() == ""
    recorder = LaunchRecorder()
    monkeypatch.setattr(w, "refusal", lambda *args: "")
    monkeypatch.setattr(w, "sparse_mla_wgmma_kernel", recorder)
    monkeypatch.setattr(w, "producer_refusal", lambda: "Triton 0.0's gl.warp_specialize takes (a, b, c, ...)")
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    pages = torch.zeros(4, 64, 656, dtype=torch.uint8)
    slots = torch.zeros(3, 300, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"ws \(the producer warpgroup\) needs another Triton: Triton 0\.0's"):
        w.sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, 0.25, ws=True)
    assert recorder.calls == []
    monkeypatch.setattr(config, "batch_invariant", lambda: True)  # (fixed splits: no device asked for its SMs)
    assert config.WGMMA_FEW_HEADS["ws"]
    ops.sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, 0.25)
    ((_, _, kwargs),) = recorder.calls
    assert kwargs["WS"] is False and "maxnreg" not in kwargs
