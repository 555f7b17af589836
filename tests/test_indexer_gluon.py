"""The Gluon indexer (:mod:`dsahal.backends.triton_kernels.indexer_gluon`) on a CPU machine.

Gluon has no interpreter: its scores are checked on the H200 against the float64 reference
(``scripts/h200/indexer_alu_sweep.py``: 32 heads with an unmapped block and a causal bound mid-tile, then 8, 16, 20 and
64 heads, 64- to 256-token blocks, FP8 and bf16 queries, rows scaled by 1e-20 and 1e20) and by the conformance suite
through ``indexer_score`` and ``dsa_attention``. Here: the k permutation the queries and the keys' shared layout must
agree on, what the launcher takes and refuses, when ``indexer_score`` sends a call to it, and that a Triton whose Gluon
does not compile the kernel makes the calls fall back rather than fail.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from dsahal.backends.triton_kernels import indexer as idx
from dsahal.backends.triton_kernels import indexer_gluon as g


def k_to_dim(k: int) -> int:
    """:func:`indexer_gluon.dim_of_k` written out for the host: bits (b, c, h, s) of k -> 32 c + 8 s + 4 h + b."""
    b, c, h, s = k & 3, (k >> 2) & 3, (k >> 4) & 1, (k >> 5) & 3
    return 32 * c + 8 * s + 4 * h + b


def test_the_queries_k_order_is_the_one_the_keys_shared_layout_reads():
    # the padded layout maps a record byte (its offset bits) to the MMA's k index; the queries are loaded with k ->
    # dim_of_k(k): the two must be inverse, or every product pairs a key byte with another dim's query
    layout = g._code_layout.fn() if hasattr(g._code_layout, "fn") else g._code_layout()
    bases = layout.offset_bases[:7]  # offset bits 0..6: the byte within a record's 128 codes
    assert all(row == 0 for row, _ in bases) and [row for row, _ in layout.offset_bases[7:]] == [1, 2, 4, 8, 16, 32]
    for byte in range(128):
        k = 0
        for bit, (_, k_bit) in enumerate(bases):
            if byte >> bit & 1:
                k ^= k_bit
        assert k_to_dim(k) == byte
    assert sorted(k_to_dim(k) for k in range(128)) == list(range(128))
    assert layout.interval_padding_pairs == [[128, 4]]  # rows 132 bytes apart: the records as copied


def test_a_thread_reads_contiguous_words_and_a_warp_hits_every_bank_once():
    # lane (row r = lane // 4, c = lane % 4) reads, for k-step s and half h, the word at record byte k_to_dim(32 s +
    # 16 h + 4 c); rows are 33 words apart: the 32 lanes of one read hit 32 different banks
    for s in range(4):
        for h in range(2):
            banks = {(33 * (lane // 4) + k_to_dim(32 * s + 16 * h + 4 * (lane % 4)) // 4) % 32 for lane in range(32)}
            assert len(banks) == 32
    for c in range(4):  # the 8 words of a row a lane holds are one run of 32 bytes
        assert sorted(k_to_dim(32 * s + 16 * h + 4 * c) for s in range(4) for h in range(2)) == \
            list(range(32 * c, 32 * c + 32, 4))


def _padded_offset(element: int, pairs) -> int:
    """Where a padded shared layout puts ``element``: after every ``interval`` elements, ``pad`` more words."""
    return element + sum(element // interval * pad for interval, pad in pairs)


def test_a_stage_holds_one_tile_exactly_and_its_two_copies_cover_it():
    # the stage buffer: [2048] words whose padding makes its allocation 64 records of 33 words; the tile is copied as
    # 2048 words then 64 (two copies of 512 and 16 pieces of 16 bytes): nothing written past the record of key 63,
    # and the scale view's last word (key 63's scale, word 32 + 33 * 63) inside it
    stage = g._STAGE.value if hasattr(g._STAGE, "value") else g._STAGE
    words = g.STAGE_WORDS.value if hasattr(g.STAGE_WORDS, "value") else g.STAGE_WORDS
    assert stage.shape == [words] and words == 2048
    allocated = _padded_offset(words - 1, stage.interval_padding_pairs) + 1
    assert allocated == 64 * 33 == g.TILE * g.RECORD_BYTES // 4
    assert words + 64 == allocated and (words + 64) * 4 // 16 == 528
    scale = g._scale_layout.fn() if hasattr(g._scale_layout, "fn") else g._scale_layout()
    assert 32 + _padded_offset(63, scale.interval_padding_pairs) == allocated - 1


def _q(tokens=2, heads=32, dtype=torch.float8_e4m3fn, device="cpu"):
    return torch.zeros(tokens, heads, 128, device=device).to(dtype)


def _pages(blocks=4, block_tokens=64, record=132, device="cpu"):
    return torch.zeros(blocks, block_tokens, record, dtype=torch.uint8, device=device)


@pytest.mark.parametrize("q, pages, fmt, why", [
    (_q(), _pages(record=68), "bf16", "bf16 keys: the Gluon indexer reads FP8 and MXFP4 keys"),
    (_q(dtype=torch.float16), _pages(), "fp8", "float16 queries: the Gluon indexer takes FP8 or bf16 queries"),
    (_q(heads=65), _pages(), "fp8", r"q of shape \[2, 65, 128\]: the Gluon indexer takes \[T, 1..64, 128\]"),
    (_q(), _pages(), "fp8", "the Gluon indexer runs on NVIDIA CUDA tensors only"),
    (_q(dtype=torch.bfloat16), _pages(), "fp8", "the Gluon indexer runs on NVIDIA CUDA tensors only"),
])
def test_refusal_names_what_the_kernel_does_not_take(q, pages, fmt, why):
    assert __import__("re").fullmatch(why, g.refusal(q, pages, fmt)), g.refusal(q, pages, fmt)


def test_a_launch_it_refuses_raises_naming_the_op_and_the_reason():
    q, w = _q(), torch.zeros(2, 32)
    t = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"triton indexer_score \(gluon\): the Gluon indexer runs on NVIDIA CUDA"):
        g.launch(q, w, _pages(), torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256, torch.empty(2, 256), starts=t,
                 group=1)


def test_launch_takes_unit_last_strides_only(monkeypatch):
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    t = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(gluon\): weights expected unit stride in its last dim, got strides \(1, 2\)"):
        g.launch(_q(), torch.zeros(32, 2).t(), _pages(), torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256,
                 torch.empty(2, 256), starts=t, group=1)


@pytest.mark.parametrize("kwargs, message", [(dict(stages=1), "stages expected 2..6, got 1"),
                                             (dict(depth=0), "depth expected 1..8, got 0"),
                                             (dict(token_stack=3), "token_stack expected 1, 2 or 4, got 3"),
                                             (dict(maxnreg=8), "maxnreg expected None or an int in 24..255, got 8"),
                                             (dict(num_warps=8), r"one warpgroup a program \(num_warps=4\), got 8"),
                                             (dict(warp_specialized=True, producer_regs=20),
                                              "producer_regs expected a multiple of 8 in 24..256, got 20"),
                                             (dict(warp_specialized=True, group=2, token_stack=2),
                                              "warp_specialized expected token_stack 1 and"),
                                             (dict(warp_specialized=True, index_fmt="mxfp4"),
                                              "warp_specialized expected token_stack 1 and FP8 keys, got "
                                              "token_stack 1, mxfp4 keys")])
def test_launch_parameters_are_checked_before_any_launch(monkeypatch, kwargs, message):
    monkeypatch.setattr(g, "refusal", lambda *args: "")  # past the device check: the parameters' own
    t = torch.zeros(2, dtype=torch.int32)
    kwargs = dict(dict(group=1), **kwargs)
    pages = _pages(record=g.MX_RECORD_BYTES) if kwargs.get("index_fmt") == "mxfp4" else _pages()
    with pytest.raises(ValueError, match=f"triton indexer_score \\(gluon\\): {message}"):
        g.launch(_q(), torch.zeros(2, 32), pages, torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256,
                 torch.empty(2, 256), starts=t, **kwargs)


def test_the_warp_specialised_variant_is_a_launch_option_off_by_default():
    # (twenty-seventh session: measured 0.96-0.99x the backend's launches on the H200, not routed: BENCHMARKS.md)
    assert g.launch_meta(_q(), _pages(), 5, 4, 1)["WS"] is False
    meta = g.launch_meta(_q(), _pages(), 5, 4, 1, head_sum_mma=True, warp_specialized=True, producer_regs=24)
    assert meta["WS"] is True and meta["PRODUCER_REGS"] == 24 and meta["HSUM"] is True


def test_a_triton_that_does_not_compile_it_is_named_and_the_calls_fall_back(monkeypatch):
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False:
                        "cannot reinterpret between padded and non-padded layouts")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    assert idx._gluon_plan({"gluon_stages": {1: 3}}, _q(), _pages(), "fp8", tokens=4, rows=4) == {}
    t = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(gluon\): this Triton \(.*\) does not compile the kernel: cannot "
                                         r"reinterpret between padded"):
        g.launch(_q(), torch.zeros(2, 32), _pages(), torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256,
                 torch.empty(2, 256), starts=t, group=1)


def test_indexer_score_sends_only_the_configured_tokens_per_request_to_it(monkeypatch):
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: "")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    tile = {"gluon_stages": {1: 3, 2: 4}, "gluon_depth": 1}
    plain = dict(stacked=False, mx_registers=False, mx_fold=False, refusal_checked=True)
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=64, rows=64) == dict(plain, stages=3, depth=1)
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=128, rows=64) == dict(plain, stages=4, depth=1)
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=320, rows=64) == {}  # 5 a request: tl
    more = dict(tile, gluon_more=dict(stages=4, depth=1, maxnreg=128), gluon_stacked=True)
    assert idx._gluon_plan(more, _q(), _pages(), "fp8", tokens=320, rows=64) == dict(
        stages=4, depth=1, maxnreg=128, stacked=True, mx_registers=False, mx_fold=False,
        refusal_checked=True)  # more than named
    assert idx._gluon_plan(more, _q(), _pages(), "fp8", tokens=4096, rows=1)["maxnreg"] == 128  # prefill
    assert idx._gluon_plan({"gluon_more": more["gluon_more"]}, _q(), _pages(), "fp8", tokens=320, rows=64) == {}
    assert idx._gluon_plan({}, _q(), _pages(), "fp8", tokens=64, rows=64) == {}  # not configured (batch invariant)
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: False)
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=64, rows=64) == {}  # CPU / ROCm: never imported


def test_a_plan_the_kernel_refuses_takes_the_tl_kernel(monkeypatch):
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: "")
    seen = []
    monkeypatch.setattr(g, "refusal", lambda q, pages, fmt, group=1: seen.append(group) or "too many tokens")
    tile = {"gluon_stages": {1: 3}, "gluon_more": dict(stages=4, group=8)}
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=640, rows=64) == {} and seen == [8]


def test_a_backend_call_runs_the_refusal_once_and_a_direct_launch_runs_it(monkeypatch):
    # the plan's refusal is the launch's (any plan's group is 1..MAX_GROUP): the launch is told and skips its own
    from launch_recorder import LaunchRecorder

    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: "")
    asked = []
    monkeypatch.setattr(g, "refusal", lambda q, pages, fmt, group=1: asked.append(group) or "")
    recorder = LaunchRecorder()
    monkeypatch.setattr(g, "indexer_gluon_kernel", recorder)
    monkeypatch.setattr(idx, "segment_plan", lambda req_ids, group: (req_ids, req_ids))
    t = torch.zeros(2, dtype=torch.int32)
    args = (_q(), torch.zeros(2, 32), _pages(), torch.zeros(2, 4, dtype=torch.int32), t, t)
    idx.indexer_score(*args, "fp8", 256, block_tiles={"gluon_stages": {1: 3}}, out=torch.empty(2, 256))
    assert len(recorder.calls) == 1 and len(asked) == 1, (len(recorder.calls), asked)
    g.launch(*args, t, 256, torch.empty(2, 256), starts=t, group=1)
    assert len(recorder.calls) == 2 and len(asked) == 2, "a direct launch must run the refusal itself"


def test_the_backend_configures_it_in_default_mode_only(monkeypatch):
    from dsahal.backends.nvidia import config

    for dtype, fmt in itertools.product((torch.float8_e4m3fn, torch.bfloat16), ("fp8", "mxfp4")):
        config.indexer_config.cache_clear()
        monkeypatch.setattr(config, "batch_invariant", lambda: False)
        tiles = config.indexer_config(32, dtype, fmt)["block_tiles"]
        assert set(tiles["gluon_stages"]) == {1, 2}
        assert "gluon_more" in tiles  # every call length (MXFP4 keys since the twenty-sixth session)
        config.indexer_config.cache_clear()
        monkeypatch.setattr(config, "batch_invariant", lambda: True)
        tiles = config.indexer_config(32, dtype, fmt).get("block_tiles", {})
        assert "gluon_stages" not in tiles and "gluon_more" not in tiles
    config.indexer_config.cache_clear()


def test_only_bf16_queries_on_fp8_keys_stack_their_hi_and_lo_parts_into_one_mma():
    bf16, fp8 = torch.zeros(4, 32, 128, dtype=torch.bfloat16), torch.zeros(4, 32, 128, dtype=torch.float8_e4m3fn)
    fp8_keys = torch.zeros(2, 64, g.RECORD_BYTES, dtype=torch.uint8)
    mx_keys = torch.zeros(2, 64, g.MX_RECORD_BYTES, dtype=torch.uint8)
    assert g.launch_meta(bf16, fp8_keys, 1, 5, stacked=True)["STACK"] is True
    assert g.launch_meta(bf16, fp8_keys, 1, 5, stacked=False)["STACK"] is False
    assert g.launch_meta(fp8, fp8_keys, 1, 5, stacked=True)["STACK"] is False  # one MMA a token already
    assert g.launch_meta(bf16, mx_keys, 1, 5, stacked=True)["STACK"] is False  # MXFP4: chained per block


@pytest.mark.parametrize("dtype", (torch.float8_e4m3fn, torch.bfloat16))
def test_the_backend_sends_calls_of_any_length_to_it_with_fewer_stages_at_64_heads(monkeypatch, dtype):
    # 33-64 heads (DeepSeek-V3.2's indexer has 64) double a token's queries in shared memory: fewer stages there
    from dsahal.backends.nvidia import config

    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    tiles = {}
    for heads in (8, 32, 33, 64):
        config.indexer_config.cache_clear()
        tiles[heads] = config.indexer_config(heads, dtype, "fp8")["block_tiles"]
    config.indexer_config.cache_clear()
    assert tiles[8]["gluon_more"] == tiles[32]["gluon_more"] and tiles[33]["gluon_more"] == tiles[64]["gluon_more"]
    assert tiles[64]["gluon_more"]["stages"] < tiles[32]["gluon_more"]["stages"]
    assert all(tiles[64]["gluon_stages"][n] <= tiles[32]["gluon_stages"][n] for n in (1, 2))
    assert "maxnreg" not in tiles[64]["gluon_more"]  # a 128-register cap spills at 64 heads


def test_the_backend_stacks_bf16_queries_on_the_gluon_route(monkeypatch):
    from dsahal.backends.nvidia import config

    config.indexer_config.cache_clear()
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    tiles = config.indexer_config(32, torch.bfloat16, "fp8")["block_tiles"]
    assert tiles["gluon_stacked"] is config._BF16_Q_GLUON["gluon_stacked"]
    config.indexer_config.cache_clear()


def test_mxfp4_calls_go_to_it_and_fp8_records_are_refused_as_mxfp4(monkeypatch):
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "_capability", lambda index: (9, 0))
    seen = []
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: seen.append(mx) or "")
    pages = _pages(record=68)
    tile = {"gluon_stages": {1: 4}}
    assert idx._gluon_plan(tile, _q(), pages, "mxfp4", tokens=64, rows=64)["stages"] == 4 and seen == [True]
    assert idx._gluon_plan(tile, _q(dtype=torch.bfloat16), pages, "mxfp4", tokens=64, rows=64)["stages"] == 4
    assert g.refusal(_q(), _pages(), "mxfp4").startswith("pages torch.uint8 [4, 64, 132]: the Gluon indexer reads "
                                                         "mxfp4 keys as uint8 [blocks, tokens, 68]")
    assert idx._gluon_plan(tile, _q(), pages, "fp8", tokens=64, rows=64) == {}  # 68-byte records are not FP8 keys


def test_compile_failure_is_asked_once_a_process(monkeypatch):
    import triton

    calls = []
    monkeypatch.setattr(triton, "__version__", "9.9.0")  # not a verified release: the compile is asked
    monkeypatch.setattr(g, "_COMPILE_FAILURES", {})
    monkeypatch.setattr(triton, "compile", lambda *args, **kwargs: calls.append(1) or (_ for _ in ()).throw(
        RuntimeError("error: cannot reinterpret between padded and non-padded layouts")))
    assert "cannot reinterpret" in g.compile_failure(False)
    assert "cannot reinterpret" in g.compile_failure(False)
    assert calls == [1]
    assert "cannot reinterpret" in g.compile_failure(False, head_sum=True) and calls == [1, 1]  # its own variant
    monkeypatch.setattr(triton, "__version__", "3.6.0")  # the H200's release, verified there
    assert g.compile_failure(True) == ""


def test_this_machines_triton_is_asked_for_real():
    import triton

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(g, "_COMPILE_FAILURES", {})
    try:
        failure = g.compile_failure(False)
    finally:
        monkeypatch.undo()
    if triton.__version__.startswith(g.VERIFIED_TRITON):
        assert failure == ""
    elif triton.__version__.startswith("3.9"):  # this release's Gluon rejects the padded view of a stage (its MLIR
        assert failure  # diagnostic, "cannot reinterpret between padded and non-padded layouts", goes to stderr)
    else:
        assert isinstance(failure, str)


def test_its_segments_are_the_calls_tokens_a_request_whatever_the_tl_default(monkeypatch):
    # the FP8-q configuration keeps 5-token segments for 1-token calls on the tl kernel (group_per_request=2); the
    # Gluon kernel runs every member's MMA, present or not, so it gets segments of the call's tokens a request
    from dsahal.backends.nvidia import config

    seen = []
    monkeypatch.setattr(idx, "_gluon_plan", lambda *args: dict(stages=3, depth=2))
    monkeypatch.setattr(idx, "segment_plan", lambda req, group: (torch.zeros_like(req), torch.zeros_like(req)))
    monkeypatch.setattr(g, "launch", lambda *args, **kwargs: seen.append(kwargs) or args[8])
    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    config.indexer_config.cache_clear()
    cfg = config.indexer_config(32, torch.float8_e4m3fn, "fp8")
    config.indexer_config.cache_clear()
    for requests, per_request in ((8, 1), (4, 2)):
        tokens = requests * per_request
        req = torch.arange(requests, dtype=torch.int32).repeat_interleave(per_request)
        pos = torch.full((tokens,), 100, dtype=torch.int32)
        idx.indexer_score(_q(tokens), torch.zeros(tokens, 32), _pages(), torch.zeros(requests, 2, dtype=torch.int32),
                          req, pos, "fp8", 128, **cfg)
        assert seen[-1]["group"] == per_request and seen[-1]["stages"] == 3


def _mx_halves(words: torch.Tensor):
    """The MXFP4 decode of :func:`indexer_gluon._mx_operands` written out for the host on int64 words (< 2^32): the
    low and high nibbles of each byte shifted into e4m3 bytes (sign to bit 7, magnitude to bits 2-4)."""
    signs = 0x80808080
    lo = ((words << 2) & 0x1C1C1C1C) | ((words << 4) & signs)
    hi = ((words >> 2) & 0x1C1C1C1C) | (words & signs)
    return lo, hi


def test_an_e2m1_code_shifted_into_e4m3_is_its_value_times_two_to_the_minus_six():
    from dsahal.formats.numerics import e2m1_decode

    codes = torch.arange(16, dtype=torch.uint8)
    shifted = (((codes.to(torch.int32) & 7) << 2) | ((codes.to(torch.int32) & 8) << 4)).to(torch.uint8)
    as_e4m3 = shifted.view(torch.float8_e4m3fn).float()
    assert torch.equal(as_e4m3 * 64, e2m1_decode(codes).float())  # subnormal code 1 (0.5) and -0 included


def test_the_mxfp4_decode_word_order_matches_the_queries_dims():
    # a code word holds dims 8 c .. 8 c + 7 of its block (byte b: dims 2 b (low nibble) and 2 b + 1); decoded, word
    # 2 c + h of the block's row holds the half h codes, byte b of it dim 8 c + 2 b + h = mx_dim(4 (2 c + h) + b)
    from dsahal.formats.numerics import e2m1_decode, pack_nibbles

    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (1, 32), generator=gen, dtype=torch.uint8)  # one block of one key
    packed = pack_nibbles(codes)  # [1, 16] bytes = 4 code words
    words = packed.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lo, hi = _mx_halves(words[0])
    row = torch.stack([lo, hi], dim=1).flatten()  # word 2 c + h
    decoded = row.to(torch.int32).view(torch.uint8).view(torch.float8_e4m3fn).float() * 64  # byte k of the row
    mx_dim = g.mx_dim.fn if hasattr(g.mx_dim, "fn") else g.mx_dim
    dims = torch.tensor([mx_dim(k) for k in range(32)])
    assert sorted(dims.tolist()) == list(range(32))
    assert torch.equal(decoded, e2m1_decode(codes[0]).float()[dims])


def test_the_mxfp4_register_operand_columns_match_the_queries_dims():
    # MX_REG: lane c decodes code word c of a block into a low and a high e4m3 word; join (low, high) then the permute
    # (0, 3, 1, 2) of [key, c, e, a] make column k = e + 4 c + 16 a, byte e of word c's half a: dim 8 c + 2 e + a
    from dsahal.formats.numerics import e2m1_decode, pack_nibbles

    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (1, 32), generator=gen, dtype=torch.uint8)
    words = pack_nibbles(codes).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [1, 4]: code word c
    lo, hi = _mx_halves(words[0])
    halves = torch.stack([lo, hi])  # [a, c]
    column = torch.empty(32)
    for a in range(2):
        for c in range(4):
            for e in range(4):
                byte = (int(halves[a, c]) >> (8 * e)) & 0xFF
                column[e + 4 * c + 16 * a] = torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mx_reg_dim = g.mx_reg_dim.fn if hasattr(g.mx_reg_dim, "fn") else g.mx_reg_dim
    dims = torch.tensor([mx_reg_dim(k) for k in range(32)])
    assert sorted(dims.tolist()) == list(range(32))
    assert torch.equal(column * 64, e2m1_decode(codes[0]).float()[dims])


def _run_ptx(text: str, inputs: dict[int, int]) -> dict[int, int]:
    """The few PTX instructions of an inline-asm decode (``and``, ``or``, ``shl``, ``shr``, ``prmt`` on .b32) run on
    the host: ``inputs`` the ``$n`` operands, returns every ``$n`` written. ``prmt.b32 d, a, b, c`` is the generic
    form: byte i of d is byte ``c[4i + 2 : 4i]`` of ``{b, a}`` (a its bytes 0-3), sign-replicated where ``c[4i + 3]``
    is set (PTX ISA)."""
    regs = {f"${n}": value for n, value in inputs.items()}

    def value(operand: str) -> int:
        operand = operand.strip()
        return int(operand, 0) & 0xFFFFFFFF if operand[0].isdigit() else regs[operand]

    for line in text.replace("{", "").replace("}", "").split(";"):
        parts = line.split(None, 1)
        if not parts or parts[0] == ".reg":
            continue
        op, args = parts[0], [a.strip() for a in parts[1].split(",")]
        x = [value(a) for a in args[1:]]
        if op == "and.b32":
            out = x[0] & x[1]
        elif op == "or.b32":
            out = x[0] | x[1]
        elif op == "shl.b32":
            out = (x[0] << x[1]) & 0xFFFFFFFF
        elif op == "shr.b32":
            out = x[0] >> x[1]
        elif op == "prmt.b32":
            pool, out = x[1] << 32 | x[0], 0
            for i in range(4):
                sel = x[2] >> 4 * i & 0xF
                byte = pool >> 8 * (sel & 7) & 0xFF
                if sel & 8:  # the byte's sign replicated
                    byte = 0xFF if byte & 0x80 else 0
                out |= byte << 8 * i
        else:
            raise AssertionError(f"an instruction the host runner does not know: {line!r}")
        regs[args[0]] = out
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}


def _fold_decode(word: int, exponent: int, top: int) -> list[float]:
    """The 8 codes of ``word`` as ``indexer_gluon._e2m1_folded`` decodes them (its PTX run on the host, the tables from
    ``_fold_tables``): codes 0-3 in its first output's bytes, 4-7 in its second's."""
    low, high = (int(getattr(t, "value", t)) & 0xFFFFFFFF for t in _host(g._fold_tables)(exponent, top))
    out = _run_ptx(str(getattr(g.FOLD_DECODE_PTX, "value", g.FOLD_DECODE_PTX)), {2: word, 6: low, 10: high})
    raw = torch.tensor([out[0] >> 8 * e & 0xFF for e in range(4)] + [out[1] >> 8 * e & 0xFF for e in range(4)],
                       dtype=torch.uint8)
    return raw.view(torch.float8_e4m3fn).double().tolist()


def test_the_folded_decode_is_every_code_times_its_blocks_distance_exactly():
    # MX_FOLD: block b's codes decoded as their values x 2^(6 - (top - e_b)) for every distance the fold takes, each
    # code at each nibble of a word, and (x the key's factor 2^(top - 133)) the code's true value x 2^(e_b - 127)
    from dsahal.formats.numerics import e2m1_decode

    span = int(getattr(g.FOLD_SPAN, "value", g.FOLD_SPAN))
    assert span == 11
    gen = torch.Generator().manual_seed(3)
    for top in (11, 140, 254):
        for distance in range(span + 1):
            exponent = top - distance
            for position in range(8):
                for code in range(16):
                    others = torch.randint(0, 16, (8,), generator=gen)
                    others[position] = code
                    word = sum(int(c) << 4 * i for i, c in enumerate(others))
                    decoded = _fold_decode(word, exponent, top)
                    want = e2m1_decode(others.to(torch.uint8)).double()
                    assert decoded == (want * 2.0 ** (6 - distance)).tolist(), (top, distance, position, code)
                    # the true values: the factor _fold_scale gives the key, the same for its every block
                    assert [d * 2.0 ** (top - 133) for d in decoded] == (want * 2.0 ** (exponent - 127)).tolist()


def test_the_folded_operand_columns_match_the_queries_dims():
    # lane c decodes code word c of a block into codes 0-3 and 4-7 of the word; join then the permute (0, 3, 1, 2)
    # of [key, c, e, a] make column k = e + 4 c + 16 a, code 4 a + e of word c: dim 8 c + 4 a + e = mx_fold_dim(k)
    from dsahal.formats.numerics import e2m1_decode, pack_nibbles

    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 16, (1, 32), generator=gen, dtype=torch.uint8)
    words = (pack_nibbles(codes).view(torch.int32).to(torch.int64) & 0xFFFFFFFF)[0].tolist()  # code word c
    column = torch.empty(32, dtype=torch.float64)
    for c, word in enumerate(words):
        decoded = _fold_decode(word, 127, 127)
        for a in range(2):
            for e in range(4):
                column[e + 4 * c + 16 * a] = decoded[4 * a + e]
    dims = torch.tensor([_host(g.mx_fold_dim)(k) for k in range(32)])
    assert sorted(dims.tolist()) == list(range(32))
    assert torch.equal(column, e2m1_decode(codes[0]).double()[dims] * 64)


def test_the_folds_span_is_the_widest_its_tables_hold_and_its_factor_covers_every_scale_byte():
    # _fold_tables takes the distance off each byte's exponent field: right while the least code (0.5) stays a
    # normal e4m3 number, up to FOLD_SPAN; one binade more and its byte would be wrong, so such keys are scored
    # block by block. The key's factor (the bits _fold_scale builds: normal from top 7, subnormal below, NaN at 255)
    from dsahal.formats.numerics import e2m1_decode

    span = int(getattr(g.FOLD_SPAN, "value", g.FOLD_SPAN))
    half = 0x11111111  # code 1 (0.5) at every nibble
    assert _fold_decode(half, 200 - span, 200) == [0.5 * 2.0 ** (6 - span)] * 8
    assert _fold_decode(half, 200 - span - 1, 200) != [0.5 * 2.0 ** (5 - span)] * 8
    assert e2m1_decode(torch.tensor([1], dtype=torch.uint8)).item() == 0.5
    import struct

    import numpy

    f32 = numpy.float32
    for top in range(256):  # (_fold_scale's arithmetic in fp32 on the host: Gluon's ops do not run here)
        unit = f32(struct.unpack("<f", struct.pack("<I", max(top << 23, 0x00400000)))[0])
        with numpy.errstate(invalid="ignore"):
            factor = unit * f32(0.015625) + unit * f32(0.0)
        assert numpy.isnan(factor) if top == 255 else factor == 2.0 ** (top - 133)


def test_the_folded_scales_are_an_mxfp4_option_of_the_register_operands_and_head_sum_mma(monkeypatch):
    # mx_fold: a launch option (the backend's configuration names it gluon_mx_fold);
    # MXFP4 keys only (ignored for FP8 keys, as mx_registers), and only with the register operands and the head-sum
    # MMA it is built on: asked otherwise, the launch says so before any launch
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    mx_pages, fp8_pages = _pages(record=68), _pages()
    meta = g.launch_meta(_q(), mx_pages, 2, 4, 1, mx_registers=True, head_sum_mma=True, mx_fold=True)
    assert meta["MX_FOLD"] and meta["MX_REG"] and meta["HSUM"]
    assert not g.launch_meta(_q(), mx_pages, 2, 4, 1, mx_registers=True, head_sum_mma=True)["MX_FOLD"]  # default
    assert not g.launch_meta(_q(), fp8_pages, 2, 4, 1, mx_registers=True, head_sum_mma=True, mx_fold=True)["MX_FOLD"]
    t = torch.zeros(2, dtype=torch.int32)
    for registers, head_sum in ((False, True), (True, False)):
        with pytest.raises(ValueError, match=r"\(gluon\): mx_fold expected mx_registers=True and head_sum_mma=True"):
            g.launch(_q(), torch.zeros(2, 32), mx_pages, torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256,
                     torch.empty(2, 256), starts=t, group=1, index_fmt="mxfp4", mx_registers=registers,
                     head_sum_mma=head_sum, mx_fold=True)
    from dsahal.backends.nvidia import config

    for q_dtype in (torch.float8_e4m3fn, torch.bfloat16):  # the backend's launch since the H200 timed it (R1, S29)
        assert config.indexer_config(32, q_dtype, "mxfp4")["block_tiles"]["gluon_mx_fold"] is True
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: "")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    tile = {"gluon_stages": {1: 4}, "gluon_mx_registers": True, "gluon_mx_fold": True}
    assert idx._gluon_plan(tile, _q(), mx_pages, "mxfp4", tokens=64, rows=64)["mx_fold"] is True


def test_another_architecture_is_refused_by_name_and_takes_the_tl_kernel(monkeypatch):
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "runs_ptx", lambda device: True)
    monkeypatch.setattr(g, "_capability", lambda index: (10, 0))
    assert g.refusal(_q(), _pages(), "fp8") == "sm_100: the Gluon indexer's wgmma is Hopper's (sm_90)"
    tile = {"gluon_stages": {1: 4}, "gluon_more": dict(stages=4, depth=1)}
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=320, rows=64) == {}


def test_a_token_stack_wider_than_an_mma_is_refused_and_ignored_where_it_does_not_apply(monkeypatch):
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    t = torch.zeros(2, dtype=torch.int32)
    q64 = _q(heads=64)
    with pytest.raises(ValueError, match=r"\(gluon\): token_stack 4 at 64 heads \(padded to 64\) expected at most "
                                         r"128 columns a MMA, got 256"):
        g.launch(q64, torch.zeros(2, 64), _pages(), torch.zeros(1, 4, dtype=torch.int32), t, t, t, 256,
                 torch.empty(2, 256), starts=t, group=4, token_stack=4)
    pages = _pages()
    assert g.launch_meta(_q(heads=64, dtype=torch.bfloat16), pages, 4, 3, token_stack=4)["TSTACK"] == 1  # bf16 q
    assert g.launch_meta(_q(heads=64), pages, 1, 3, token_stack=4)["TSTACK"] == 1  # one token a segment
    assert g.launch_meta(_q(), pages, 5, 3, token_stack=4)["TSTACK"] == 4


@pytest.mark.parametrize("tstack", (1, 2, 4))
def test_the_token_units_cover_each_segment_once_with_power_of_two_widths(tstack):
    # token_stack's decomposition of a segment of GROUP tokens into stacked MMAs (Gluon has no interpreter: the
    # kernel's scores are checked on the H200, its unit arithmetic here)
    for group in range(1, g.MAX_GROUP + 1):
        covered = []
        for u in range(g._units(group, tstack)):
            tokens, width = g._unit_tokens(u, group, tstack), g._unit_width(u, group, tstack)
            assert 1 <= tokens <= width <= tstack and width & (width - 1) == 0
            covered += [u * tstack + j for j in range(tokens)]
        assert covered == list(range(group))


def _host(fn):
    """A Gluon ``constexpr_function`` / ``jit`` helper as a plain host function."""
    return fn.fn if hasattr(fn, "fn") else fn


def test_the_head_sum_operand_pairs_each_relu_score_with_its_heads_weight():
    # HSUM: lane c holds the token MMA's accumulator columns 8 i + 2 c + j (j < 2); the tf32 MMA's register A operand
    # gives lane c the k indices 8 i + c and 8 i + c + 4. The kernel's reshape / permute of the relu'd accumulator
    # (_relu_operand) and of the weights (_sum_weights) must both put head 8 i + 2 c + j at k = 8 i + 4 j + c
    # (head_of_k), so each product pairs a head's relu'd score with that head's weight
    head_of_k = _host(g.head_of_k)
    gen = torch.Generator().manual_seed(2)
    for heads in (16, 32, 64):
        acc = torch.randn(64, heads, generator=gen, dtype=torch.float64)
        w = torch.randn(heads, generator=gen, dtype=torch.float64)
        relu = acc.clamp_min(0)
        operand = relu.reshape(64, heads // 8, 4, 2).permute(0, 1, 3, 2).reshape(64, heads)  # _relu_operand
        ordered = w.reshape(heads // 8, 4, 2).permute(0, 2, 1).reshape(heads)  # _sum_weights
        order = [head_of_k(k) for k in range(heads)]
        assert sorted(order) == list(range(heads))
        assert torch.equal(operand, relu[:, order]) and torch.equal(ordered, w[order])
        torch.testing.assert_close(operand @ ordered, relu @ w)
        for lane_c in range(4):  # the columns a lane holds are the k indices its tf32 operand takes: no data moves
            held = {8 * i + 2 * lane_c + j for i in range(heads // 8) for j in range(2)}
            assert {order[k] for i in range(heads // 8) for k in (8 * i + lane_c, 8 * i + lane_c + 4)} == held


@pytest.mark.parametrize("per_token", (1, 2, 4, 8))
@pytest.mark.parametrize("depth", (1, 2, 3))
def test_the_head_sum_waits_retire_every_group_a_token_reads_and_no_more(depth, per_token):
    # the commit groups of _tile's HSUM loop in issue order; wgmma groups retire in order, so waiting with n pending
    # retires all but the n last issued: each wait must retire token g's MMAs and token g - 1's head sum (its result is
    # read then), and leaves as many pending as it can (the MMAs still in flight)
    pending = _host(g._pending)
    for group in range(1, 9):
        d = min(depth, group)
        issued = []
        for t in range(d):
            issued += [("mma", t)] * per_token
        for t in range(group):
            n = pending(t, d, group, per_token, True)
            retired = issued[:len(issued) - n] if n else issued
            need = {("mma", t)} | ({("sum", t - 1)} if t else set())
            assert need <= set(retired), (group, t)
            tail = issued[len(issued) - n:] if n else []
            assert all(kind == "mma" and u > t for kind, u in tail), (group, t)  # only later tokens' MMAs in flight
            assert issued[len(issued) - n - 1] in need, (group, t)  # and all of them: the group before is needed
            if d == 1:  # the next token's MMAs, then this token's head sum
                if t + 1 < group:
                    issued += [("mma", t + 1)] * per_token
                issued.append(("sum", t))
            else:  # the head sum, then the token depth ahead's MMAs
                issued.append(("sum", t))
                if t + d < group:
                    issued += [("mma", t + d)] * per_token
        assert issued.count(("sum", group - 1)) == 1  # the last head sum: waited on with none pending after the loop


def test_the_head_sum_mma_serves_the_calls_where_it_measured_faster(monkeypatch):
    # twenty-sixth session (H200), FP8 keys: 1.10-1.12x at 64 x 5 with <= 32 heads, 1.03x / 1.07x with FP8 queries at
    # 64 heads; 1.00-1.04x at 1-2 tokens a request and slower with bf16 queries at 64 heads: not taken there. MXFP4
    # keys: 1.01-1.08x at 1-2 tokens, and it brings their longer calls to the Gluon kernel (1.16-1.19x the tl one)
    from dsahal.backends.nvidia import config

    monkeypatch.setattr(config, "batch_invariant", lambda: False)
    for heads, dtype, taken in ((8, torch.float8_e4m3fn, True), (32, torch.float8_e4m3fn, True),
                                (64, torch.float8_e4m3fn, True), (32, torch.bfloat16, True),
                                (33, torch.bfloat16, False), (64, torch.bfloat16, False)):
        config.indexer_config.cache_clear()
        tiles = config.indexer_config(heads, dtype, "fp8")["block_tiles"]
        assert tiles["gluon_more"].get("head_sum_mma", False) is taken, (heads, dtype)
        assert not tiles.get("gluon_head_sum")  # FP8 keys: not at 1-2 tokens a request
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):  # MXFP4 keys: at every call length
        config.indexer_config.cache_clear()
        tiles = config.indexer_config(32, dtype, "mxfp4")["block_tiles"]
        assert tiles["gluon_head_sum"] is True and tiles["gluon_more"]["head_sum_mma"] is True
    config.indexer_config.cache_clear()
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: "")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    tile = {"gluon_stages": {1: 5}, "gluon_more": dict(stages=4, depth=1, head_sum_mma=True)}
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=320, rows=64)["head_sum_mma"] is True
    assert "head_sum_mma" not in idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=64, rows=64)
    assert idx._gluon_plan(dict(tile, gluon_head_sum=True), _q(), _pages(), "fp8", tokens=64, rows=64)["head_sum_mma"]
    assert g.launch_meta(_q(), _pages(), 5, 4, 1, head_sum_mma=True)["HSUM"] is True
    assert g.launch_meta(_q(), _pages(), 5, 4, 1, token_stack=2, head_sum_mma=True)["HSUM"] is False  # one MMA a token


def test_a_triton_that_compiles_the_kernel_but_not_its_head_sum_mma_keeps_those_calls_on_the_tl_kernel(monkeypatch):
    # the head-sum MMA's operand reorder is asserted free of data movement: a release that cannot prove it refuses
    # that variant only, so the plan asks for the variant it would launch
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    asked = []
    monkeypatch.setattr(g, "compile_failure", lambda hi_lo, mx=False, head_sum=False, fold=False: (
        asked.append(head_sum) or ("the conversion is not trivial" if head_sum else "")))
    tile = {"gluon_stages": {1: 5}, "gluon_more": dict(stages=4, depth=1, head_sum_mma=True)}
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=320, rows=64) == {} and asked == [True]
    assert idx._gluon_plan(tile, _q(), _pages(), "fp8", tokens=64, rows=64)["stages"] == 5 and asked[-1] is False


def test_a_triton_that_compiles_the_mxfp4_kernel_but_not_its_folded_scales_keeps_those_calls_off_it(monkeypatch):
    # the probe compiles the folded variant when the plan would launch it (its own entry: a release may take the
    # unfolded kernel and not the fold's inline PTX), and a refusal sends those calls to the tl kernel
    import triton

    monkeypatch.setattr(triton, "__version__", "0.0.0-not-verified")
    monkeypatch.setattr(g, "_COMPILE_FAILURES", {})
    folds = []

    def compile_(source, target=None, options=None):
        folds.append(source.constants[(source.fn.arg_names.index("MX_FOLD"),)])
        if folds[-1]:
            raise RuntimeError("inline asm refused")

    monkeypatch.setattr(triton, "compile", compile_)
    assert g.compile_failure(False, mx=True, head_sum=True) == ""
    assert "inline asm refused" in g.compile_failure(False, mx=True, head_sum=True, fold=True)
    assert g.compile_failure(False, mx=True, head_sum=False, fold=True) == ""  # (no fold without the head sums)
    assert folds == [False, True, False]  # (the last: the unfolded head-sum-free variant, its own entry)
    monkeypatch.setattr(g, "refusal", lambda *args: "")
    monkeypatch.setattr(idx.indexer_decode, "runs_ptx", lambda device: True)
    tile = {"gluon_stages": {1: 4}, "gluon_mx_registers": True, "gluon_head_sum": True}
    assert idx._gluon_plan(tile, _q(), _pages(record=68), "mxfp4", tokens=64, rows=64)["stages"] == 4
    assert idx._gluon_plan(dict(tile, gluon_mx_fold=True), _q(), _pages(record=68), "mxfp4", tokens=64,
                           rows=64) == {}


def test_the_compile_probe_and_the_aot_build_pass_every_constexpr_as_one(monkeypatch):
    # a constexpr the probe or the AOT build leaves out of its constexprs becomes a run-time argument of the compile:
    # then `if WS:` branches at run time and the probe reports a failure the launch would not have (twenty-seventh
    # session: WS and PRODUCER_REGS were missing from both until the sm_90 compile said so)
    import triton

    from dsahal.backends.nvidia import aot
    from dsahal.kernel_launch import triton_launch

    names = {p.name for p in triton_launch(g.indexer_gluon_kernel).params if p.is_constexpr}
    seen = {}
    monkeypatch.setattr(triton, "__version__", "0.0.0-not-verified")
    monkeypatch.setattr(g, "_COMPILE_FAILURES", {})
    monkeypatch.setattr(triton, "compile", lambda source, target=None, options=None: seen.update(source.signature))
    assert g.compile_failure(False, mx=True, head_sum=True) == ""
    # (maxima_ptr: a pointer, or None where no group maxima are made, which Triton compiles as a constexpr)
    assert {name for name, kind in seen.items() if kind == "constexpr"} == names | {"maxima_ptr"}
    fused = 0
    for variant in aot._gluon_indexer_variants():
        if "maxima_ptr" in variant.pointers:  # the fused indexer -> top-k's launches
            fused += 1
            assert set(variant.constexprs) == names, variant.name
        else:
            assert set(variant.constexprs) == names | {"maxima_ptr"}, variant.name
    assert fused == 9
