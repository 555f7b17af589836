"""The block-tile indexer's key chunks: the run-time tile count, the launch's choice of chunk length
(``indexer_decode.tiles_per_program``, launcher ``wide_tiles``) and the L2 hint's checks (``l2_ahead``).

A chunk's length only decides which program scores which key tiles, never a score's arithmetic: with the
program threshold lowered so a tiny launch takes long chunks, the scores under the interpreter must equal the
short-chunk launch's bit for bit and the float64 reference within the fp32 tolerance, on a paged batch with an
unmapped and an out-of-range block and causal bounds mid-tile. The L2 hint is inline PTX (``prefetch.global.L2``):
the interpreter cannot run it, so CPU launches skip it (its compile is checked by ``python -m
dsahal.backends.nvidia.aot --only "L2 hint"``, its effect on the H200 by ``scripts/h200/indexer_alu_sweep.py``).
"""
from __future__ import annotations

import json

import pytest

from indexer_cases import paged_case
from interpreter_child import child_results, run_groups

TOL = 1e-5


def test_chunk_length_follows_the_programs_a_launch_has():
    from dsahal.backends.triton_kernels import indexer_decode as d

    programs = d.WIDE_TILE_PROGRAMS
    # 64 one-token requests at 128K keys in 64-key tiles: 2048 tiles a row, 32 chunks of 64 -> 2048 programs
    assert d.tiles_per_program(64, 128 * 1024, 64, 16, 64) == 64
    # 64 requests at 4K: 64 tiles a row; even 16-tile chunks give 256 programs: the short chunk stays
    assert d.tiles_per_program(64, 4096, 64, 16, 64) == 16
    assert d.tiles_per_program(64, 16 * 1024, 64, 16, 64) == 16  # 256 tiles a row: 512 programs at 32
    assert d.tiles_per_program(64, 32 * 1024, 64, 16, 64) == 32  # 512 tiles: 1024 at 32, 512 at 64
    assert d.tiles_per_program(64, 64 * 1024, 64, 16, 64) == 64  # 1024 tiles: 1024 programs at 64
    # exactly at the threshold counts; one program short halves the chunk
    rows = programs // 4
    assert d.tiles_per_program(rows, 4 * 64 * 64, 64, 16, 64) == 64
    assert d.tiles_per_program(rows - 1, 4 * 64 * 64, 64, 16, 64) == 32
    # wide_tiles equal to tiles: nothing to choose
    assert d.tiles_per_program(10 ** 6, 10 ** 7, 64, 16, 16) == 16


def test_segments_are_counted_from_tokens_group_and_rows():
    from dsahal.backends.triton_kernels import indexer_decode as d

    assert d.expected_segments(64, 8, 64) == 64  # a one-token decode: one segment a request
    assert d.expected_segments(320, 5, 64) == 64  # five tokens a request, 5-token segments
    assert d.expected_segments(320, 5, 2) == 64  # two long runs: ceil(320 / 5)
    assert d.expected_segments(4096, 5, 8) == 820  # a prefill of 8 requests
    assert d.expected_segments(3, 8, 64) == 3  # fewer tokens than rows: not more segments than tokens


def _launch_args(tokens=3, width=64):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d

    ids = torch.zeros(tokens, dtype=torch.int32)
    return (torch.zeros(tokens, 4, 128, dtype=torch.bfloat16), torch.zeros(tokens, 4),
            torch.zeros(2, 16, 132, dtype=torch.uint8), torch.zeros(1, 4, dtype=torch.int32), ids, ids, ids,
            "fp8", width, torch.empty(0)), dict(dot=d.DOT_BF16, block_n=16, group=2,
                                                starts=torch.arange(tokens, dtype=torch.int32))


@pytest.mark.parametrize("changes, needle", [
    (dict(loop=0, l2_ahead=2), "tile_loop=0"),
    (dict(loop=3, l2_ahead=4), "tile_loop=3"),
    (dict(loop=1, l2_ahead=1), "l2_ahead=1"),
    (dict(loop=1, l2_ahead=9), "l2_ahead=9"),
    (dict(loop=0, tiles=4, wide_tiles=16), "tile_loop=0"),
    (dict(loop=1, tiles=8, wide_tiles=4), "wide_tiles=4"),
])
def test_chunk_options_outside_their_loop_are_named_errors(changes, needle):
    from dsahal.backends.triton_kernels import indexer_decode as d

    args, kwargs = _launch_args()
    with pytest.raises(ValueError, match="triton indexer_score") as info:
        d.launch(*args, **dict(kwargs, **changes))
    assert needle in str(info.value)


def test_rolled_loops_get_the_chosen_count_at_run_time(monkeypatch):
    """The rolled loops compile once whatever the count (``TILES`` 0, the count a run-time argument);
    the unrolled loop keeps its compile-time count."""
    from dsahal.backends.triton_kernels import indexer_decode as d

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((grid, args, meta))

    monkeypatch.setattr(d, "indexer_tiles_kernel", Recorder())
    monkeypatch.setattr(d, "WIDE_TILE_PROGRAMS", 6)
    args, kwargs = _launch_args(tokens=3, width=16 * 16)  # 16 tiles a row; 3 one-token segments
    d.launch(*args, **dict(kwargs, group=1, loop=1, tiles=2, wide_tiles=8))  # 3 x 2 chunks of 8 = 6 programs
    d.launch(*args, **dict(kwargs, group=1, loop=1, tiles=2))
    d.launch(*args, **dict(kwargs, group=1, loop=0, tiles=4))
    (g_wide, a_wide, m_wide), (g_two, a_two, m_two), (g_unrolled, a_unrolled, m_unrolled) = launched
    n_tiles = d.SIZE_ARGS.index("n_tiles")  # (its place among the sizes)
    sizes = lambda a: a[-len(d.SIZE_ARGS):]  # noqa: E731 - the size arguments close the positional list
    assert (g_wide, sizes(a_wide)[n_tiles], m_wide["TILES"]) == ((3, 2), 8, 0)
    assert (g_two, sizes(a_two)[n_tiles], m_two["TILES"]) == ((3, 8), 2, 0)
    assert (g_unrolled, sizes(a_unrolled)[n_tiles], m_unrolled["TILES"]) == ((3, 4), 4, 4)
    assert m_wide["L2_AHEAD"] == 0 and m_wide["L2_LINES"] == 0


def _chunk_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.formats import index_format
    from dsahal.reference.indexer import indexer_score as reference

    block_tokens = 16
    table, req, pos = paged_case(block_tokens)
    width = 4 * block_tokens - 3
    dense = torch.randn(8 * block_tokens, 128) * (torch.rand(8 * block_tokens, 1) * 3 + 0.1)
    pages = index_format("fp8").pack(dense).view(8, block_tokens, -1)
    q = torch.randn(8, 4, 128)
    w = torch.randn(8, 4)
    want = reference(q, w, pages, torch.where(table >= 8, -1, table), req, pos, "fp8", width)
    offsets = run_offsets(req)
    runs = {}
    d.WIDE_TILE_PROGRAMS = 1  # every launch has programs to spare: the longest chunk is taken
    for label, changes in (("short", dict(tiles=1)), ("wide", dict(tiles=1, wide_tiles=4)),
                           ("wide_l2", dict(tiles=1, wide_tiles=4, l2_ahead=2)),
                           ("wide_group5", dict(tiles=1, wide_tiles=2, group=5))):
        out = torch.full((8, width), float("nan"))  # an unwritten score stays NaN and fails
        runs[label] = d.launch(q, w, pages, table, req, pos, offsets, "fp8", width, out, dot=d.DOT_FP32,
                               block_n=block_tokens, **dict(dict(group=2, loop=1), **changes))
    finite = torch.isfinite(want)
    for label, got in runs.items():
        same_mask = torch.equal(torch.isfinite(got), finite) and bool(torch.isneginf(got[~finite]).all())
        a, b = got[finite].double(), want[finite].double()
        results[f"ref_{label}"] = same_mask and float((a - b).norm() / b.norm()) < TOL
        if label != "short":
            results[f"bits_{label}"] = torch.equal(got, runs["short"])


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_chunk_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_short_chunks_match_the_reference(interpreted):
    assert interpreted["ref_short"]


@pytest.mark.parametrize("label", ["wide", "wide_l2", "wide_group5"])
def test_long_chunks_give_the_short_chunks_scores(interpreted, label):
    assert interpreted[f"ref_{label}"], label
    assert interpreted[f"bits_{label}"], label


def test_segments_follow_the_tokens_per_request_from_the_configured_count():
    """``group_per_request`` (``indexer._request_group``): True shortens segments to the call's tokens per
    request; an int shortens them only from that many tokens a request on (the H200 config of FP8 queries: 2,
    where 1-token calls measured slower with 1-token segments); never longer than the configured group."""
    from dsahal.backends.triton_kernels.indexer import _request_group

    assert _request_group(5, 64, 64, False) == 5
    assert _request_group(5, 64, 64, None) == 5
    assert _request_group(5, 64, 64, True) == 1  # a decode step of one token per request
    assert _request_group(5, 128, 64, True) == 2
    assert _request_group(5, 64, 64, 2) == 5  # FP8 q: 1-token calls keep the configured segments
    assert _request_group(5, 128, 64, 2) == 2  # 2 tokens a request: 2-token segments
    assert _request_group(5, 127, 64, 2) == 2  # ceil(127 / 64)
    assert _request_group(5, 320, 64, 2) == 5
    assert _request_group(5, 4096, 1, 2) == 5  # a prefill: never past the configured group
    assert _request_group(5, 10, 0, True) == 5  # an empty block table counts as one row
    assert _request_group(5, 3, 64, True) == 1


def test_backend_configs_take_the_measured_segment_policy():
    """The nvidia configs: FP8 keys shorten segments from 2 tokens a request with FP8 queries, always with bf16
    queries (sixteenth session, H200: BENCHMARKS.md); MXFP4 keys keep the configured segments."""
    import torch

    from dsahal.backends.nvidia.config import indexer_config

    assert indexer_config(32, torch.float8_e4m3fn, "fp8")["block_tiles"]["group_per_request"] == 2
    assert indexer_config(32, torch.bfloat16, "fp8")["block_tiles"]["group_per_request"] is True
    assert not indexer_config(32, torch.float8_e4m3fn, "mxfp4")["block_tiles"].get("group_per_request")


def test_the_l2_hint_follows_the_tokens_per_request():
    """``l2_ahead_tokens`` (``indexer._l2_ahead``): the hint for calls of at most that many tokens a request, none
    past it; no limit keeps it everywhere. The nvidia configs (eighteenth session, H200: BENCHMARKS.md): FP8 keys
    2 tiles ahead up to 2 tokens a request, MXFP4 keys 4 ahead at every length."""
    import torch

    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import _l2_ahead

    assert _l2_ahead(2, 64, 64, 2) == 2 and _l2_ahead(2, 128, 64, 2) == 2  # 1 and 2 tokens a request
    assert _l2_ahead(2, 129, 64, 2) == 0 and _l2_ahead(2, 320, 64, 2) == 0  # ceil(129 / 64) = 3; 5
    assert _l2_ahead(2, 4096, 1, 2) == 0  # a prefill
    assert _l2_ahead(4, 4096, 1, None) == 4 and _l2_ahead(0, 8, 8, 2) == 0
    assert _l2_ahead(2, 3, 0, 2) == 0  # an empty block table counts as one row
    for q_dtype in (torch.float8_e4m3fn, torch.bfloat16):
        tiles = indexer_config(32, q_dtype, "fp8")["block_tiles"]
        assert (tiles["l2_ahead"], tiles["l2_ahead_tokens"]) == (2, 2), tiles
        tiles = indexer_config(32, q_dtype, "mxfp4")["block_tiles"]
        assert tiles["l2_ahead"] == 4 and tiles.get("l2_ahead_tokens") is None, tiles


def test_indexer_score_passes_the_call_s_hint_to_the_launch(monkeypatch):
    """What ``indexer_score`` hands ``indexer_decode.launch`` for 1-, 2- and 5-token decode calls and a prefill."""
    import torch

    from dsahal.backends.triton_kernels import indexer, indexer_decode

    seen = []
    monkeypatch.setattr(indexer_decode, "launch", lambda *a, **kw: seen.append(kw["l2_ahead"]))
    monkeypatch.setattr(indexer, "segment_plan", lambda req_ids, group: (None, None))  # (a Triton launch)
    pages = torch.zeros(8, 16, 132, dtype=torch.uint8)
    tiles = dict(block_n=16, tile_group=5, tiles=2, tile_loop=1, num_warps=4, num_stages=1, l2_ahead=2,
                 l2_ahead_tokens=2)
    for requests, per_request in ((4, 1), (4, 2), (4, 5), (1, 40)):
        tokens = requests * per_request
        q = torch.zeros(tokens, 4, 128).to(torch.float8_e4m3fn)
        req = torch.arange(requests, dtype=torch.int32).repeat_interleave(per_request)
        indexer.indexer_score(q, torch.zeros(tokens, 4), pages, torch.zeros(requests, 2, dtype=torch.int32), req,
                              torch.zeros(tokens, dtype=torch.int32), "fp8", 32, block_n=16, block_tiles=tiles)
    assert seen == [2, 2, 0, 0], seen


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
