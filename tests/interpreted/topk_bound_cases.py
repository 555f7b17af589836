"""The max-bound top-k (:mod:`dsahal.backends.triton_kernels.topk_bound` and :mod:`.topk_groups`'s variant)
under the Triton interpreter, against the float64 reference: the exact set (tie rule: equal scores go to the
smaller index) in index order, -1 padding last, on rows built to break it (ties wider than a chunk and a
segment, one value everywhere, -inf rows, lengths 0 / k - 1 / k / k + 1, crowded exponents, signed zeros,
negatives), int64 lengths, slot emission, a caller's scratch, and the same bits whatever the chunking."""
from __future__ import annotations

import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/test_topk_bound.py (TRITON_INTERPRET=1 before triton is imported)"

import pytest  # noqa: E402
import torch  # noqa: E402

from dsahal.backends.triton_kernels.topk import topk  # noqa: E402
from dsahal.backends.triton_kernels.topk_bound import auto_group  # noqa: E402
from dsahal.backends.triton_kernels.topk_groups import auto_group_size  # noqa: E402
from dsahal.reference.topk import topk as reference  # noqa: E402

SMALL = dict(method="bound", chunk=16, finish_chunk=16, num_warps=1, finish_warps=1)
GROUPS = dict(SMALL, method="groups", steps=2, batch=4)


def expected(scores, lengths, k):
    """The reference's set in index order, -1 padding last: the order :mod:`.topk_bound` writes."""
    want = reference(scores, lengths, k)
    rows = []
    for row in want:
        valid = row[row >= 0].sort().values
        rows.append(torch.cat([valid, row.new_full((k - valid.numel(),), -1)]))
    return torch.stack(rows)


def hard_rows(gen, width, k):
    """``[R, width]`` fp32 rows and ``[R]`` lengths that probe the bound, the tie rule and padding."""
    rows, lengths = [], []

    def add(row, length=width):
        rows.append(row.float())
        lengths.append(length)

    add(torch.randn(width, generator=gen))
    add(torch.randint(0, 3, (width,), generator=gen).float())  # ties wider than a chunk and a segment
    add(torch.full((width,), 1.5))  # one value everywhere: the first k indices win
    add(torch.full((width,), float("-inf")))  # nothing to choose: all padding
    for length in (0, k - 1, k, k + 1):
        add(torch.randn(width, generator=gen), max(length, 0))
    # crowded exponents: every score in [1, 1 + 2^-12), so the top 20 key bits are one value
    add(1.0 + torch.randint(0, 1 << 11, (width,), generator=gen).float() * 2.0**-23)
    # the indexer's shape: a relu'd weighted sum, many exact zeros, the rest crowding two octaves
    add(torch.relu(torch.randn(width, generator=gen)) * 3.0 + 4.0 * (torch.rand(width, generator=gen) < 0.5))
    signed_zeros = torch.zeros(width)
    signed_zeros[::2] = -0.0
    signed_zeros[width // 2:] = torch.randn(width - width // 2, generator=gen).abs().neg()  # zeros win
    add(signed_zeros)
    mixed = torch.randn(width, generator=gen)
    mixed[torch.rand(width, generator=gen) < 0.3] = float("-inf")  # -inf inside the length
    add(mixed, width - 5)
    rising = torch.arange(width).float()  # the best entries all in the last segment
    add(rising)
    add(-rising)  # ... and all in the first
    return torch.stack(rows), torch.tensor(lengths, dtype=torch.int32)


# (64, 40, 2): 32 lanes < k, so no bound (L = 1) and more than k survivors: the finish kernel's two-digit fallback
@pytest.mark.parametrize("width,k,group", [(200, 9, 2), (160, 24, None), (64, 64, 1), (40, 48, 2), (64, 1, 2),
                                          (64, 40, 2)])
def test_bound_topk_matches_reference(width, k, group):
    gen = torch.Generator().manual_seed(width * 131 + k)
    scores, lengths = hard_rows(gen, width, k)
    got = topk(scores, lengths, k, group=group, **SMALL)
    want = expected(scores, lengths, k)
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ from the reference (width {width}, k {k}, group {group})"


@pytest.mark.parametrize("width,k,size,steps", [(200, 9, 4, 1), (160, 24, None, 2), (40, 48, 2, 2), (256, 5, 16, 4),
                                                (256, 20, 16, 4)])
def test_group_bound_topk_matches_reference(width, k, size, steps):
    gen = torch.Generator().manual_seed(width * 7 + k)
    scores, lengths = hard_rows(gen, width, k)
    got = topk(scores, lengths, k, **dict(GROUPS, group_size=size, steps=steps))
    want = expected(scores, lengths, k)
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ from the reference (width {width}, k {k}, group size {size}, steps {steps})"


@pytest.mark.parametrize("width,k,size,steps,hist_chunk", [(200, 9, 4, 1, None), (256, 20, 16, 4, None),
                                                           (40, 48, 2, 2, None), (1024, 5, 64, 2, None),
                                                           (256, 20, 2, 4, 8)])
@pytest.mark.parametrize("method", ["bound", "groups"])
def test_segment_histograms_give_the_same_survivors_and_output(method, width, k, size, steps, hist_chunk,
                                                               monkeypatch):
    """The threshold's first digit from the first pass's per-segment histograms: the same bound (so the same
    survivors, row by row) and the same output bit for bit as reading the maxima twice, and the finish's first
    histogram from the compaction's per-segment ones: the same output (the last case histograms a segment's 32
    maxima and its survivors in steps of 8)."""
    from dsahal.backends.triton_kernels import topk_bound, topk_groups

    if hist_chunk:
        monkeypatch.setattr(topk_groups, "MAXIMA_HIST_CHUNK", hist_chunk)
        monkeypatch.setattr(topk_groups, "SURVIVOR_HIST_CHUNK", hist_chunk)
        monkeypatch.setattr(topk_bound, "SURVIVOR_HIST_CHUNK", hist_chunk)
    gen = torch.Generator().manual_seed(width * 5 + k)
    scores, lengths = hard_rows(gen, width, k)
    results = []
    for histograms in (False, True):
        stats = {}
        out = torch.empty(lengths.numel(), k, dtype=torch.int32)
        if method == "groups":
            kw = dict(GROUPS, group_size=size, steps=steps, chunk=max(16, size * 2))
            launch = topk_groups.topk_groups
        else:  # (size: entries a lane; segments of 16 lanes)
            kw, launch = dict(SMALL, group=size), topk_bound.topk_bound
        kw.pop("method")
        launch(scores, lengths, k, out, False, lengths, lengths.view(1, -1), 1, stats=stats,
               segment_histograms=histograms, **kw)
        results.append((out, stats["survivors"]))
    assert torch.equal(results[1][0], expected(scores, lengths, k)), "the set differs from the reference"
    assert torch.equal(results[1][0], results[0][0]), "segment histograms changed the output's bits"
    assert torch.equal(results[1][1], results[0][1]), "segment histograms changed the bound (survivors differ)"


@pytest.mark.parametrize("width,k,size,batch", [(200, 9, 4, 4), (256, 20, 2, 2), (40, 48, 2, 4), (1024, 5, 64, 1)])
def test_compaction_prefetch_gives_the_same_survivors_and_output(width, k, size, batch):
    """The compaction's next loads issued before each batch's scan (1, 2, 3 and many batches a segment, and rows
    with no live group): the same survivors and output bit for bit, with and without segment histograms."""
    from dsahal.backends.triton_kernels import topk_groups

    gen = torch.Generator().manual_seed(width * 3 + k)
    scores, lengths = hard_rows(gen, width, k)
    results = []
    for prefetch, histograms in ((False, False), (True, False), (True, True)):
        stats = {}
        out = torch.empty(lengths.numel(), k, dtype=torch.int32)
        kw = dict(GROUPS, group_size=size, steps=2, chunk=max(16, size * 2), batch=batch)
        kw.pop("method")
        topk_groups.topk_groups(scores, lengths, k, out, False, lengths, lengths.view(1, -1), 1, stats=stats,
                                compact_prefetch=prefetch, segment_histograms=histograms, **kw)
        results.append((out, stats["survivors"]))
    assert torch.equal(results[0][0], expected(scores, lengths, k)), "the set differs from the reference"
    for out, survivors in results[1:]:
        assert torch.equal(out, results[0][0]), "the prefetching compaction changed the output's bits"
        assert torch.equal(survivors, results[0][1]), "the prefetching compaction kept other survivors"


@pytest.mark.parametrize("width,k,size,steps,histograms", [(200, 9, 4, 2, False), (200, 9, 4, 2, True),
                                                           (256, 20, 2, 4, True), (40, 48, 2, 2, True),
                                                           (1000, 7, 8, 1, False)])
def test_given_group_maxima_give_the_same_survivors_and_output(width, k, size, steps, histograms):
    """The fused indexer -> top-k's contract: maxima made by the scores' producer (here torch) in place of the first
    pass give the same bound (the same survivors, row by row) and the same output bit for bit, with and without the
    compaction's and finish's segment histograms (the threshold then reads the maxima for its first digit)."""
    from dsahal.backends.triton_kernels import topk_groups

    gen = torch.Generator().manual_seed(width * 11 + k)
    scores, lengths = hard_rows(gen, width, k)
    kw = dict(GROUPS, group_size=size, steps=steps, chunk=max(16, size * 2), segment_histograms=histograms)
    kw.pop("method")
    got_size, columns = topk_groups.maxima_layout(width, k, **kw)
    assert got_size == size
    results = []
    for maxima in (None, topk_groups.maxima_of(scores, lengths, size, columns)):
        stats = {}
        out = torch.empty(lengths.numel(), k, dtype=torch.int32)
        topk_groups.topk_groups(scores, lengths, k, out, False, lengths, lengths.view(1, -1), 1, stats=stats,
                                maxima=maxima, **kw)
        results.append((out, stats["survivors"]))
    assert torch.equal(results[0][0], expected(scores, lengths, k)), "the set differs from the reference"
    assert torch.equal(results[1][0], results[0][0]), "given maxima changed the output's bits"
    assert torch.equal(results[1][1], results[0][1]), "given maxima changed the bound (survivors differ)"


def test_given_group_maxima_are_checked():
    from dsahal.backends.triton_kernels import topk_groups

    scores, lengths = torch.randn(3, 64), torch.full((3,), 64, dtype=torch.int32)
    kw = dict(GROUPS, group_size=2, steps=2)
    size, columns = topk_groups.maxima_layout(64, 4, **kw)
    for bad in (torch.zeros(3, columns - 1, dtype=torch.int32), torch.zeros(3, columns, dtype=torch.int64),
                torch.zeros(columns, 3, dtype=torch.int32).t()):
        with pytest.raises(ValueError, match=f"argument 'maxima' expected a contiguous int32 \\[3, {columns}\\]"):
            topk(scores, lengths, 4, group_maxima=bad, **kw)
    with pytest.raises(ValueError, match="'group_maxima' is read by method 'groups' only, got method 'bound'"):
        topk(scores, lengths, 4, group_maxima=torch.zeros(3, columns, dtype=torch.int32), **SMALL)


def test_segment_histograms_need_segments_of_at_most_2048_groups():
    # the threshold's segments are then the first pass's: 4096 one-entry groups a segment are two of its
    with pytest.raises(ValueError, match="segment_histograms expected at most 2048 groups a segment, got 4096"):
        topk(torch.zeros(1, 8192), torch.ones(1, dtype=torch.int32), 2,
             **dict(GROUPS, chunk=4096, group_size=1, steps=1, segment_histograms=True))


def test_wide_group_bound_topk_matches_reference():
    """The shape of the backend's choice for rows of >= 1M scores (``config._TOPK_GROUPS_WIDE``: 64-entry groups,
    segments of 64 steps), in miniature: 64-entry groups, 8 segments, k small against the row."""
    gen = torch.Generator().manual_seed(1024 * 7 + 5)
    scores, lengths = hard_rows(gen, 1024, 5)
    got = topk(scores, lengths, 5, **dict(GROUPS, chunk=64, group_size=64, steps=2, batch=2))
    want = expected(scores, lengths, 5)
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ from the reference (64-entry groups)"


def test_bound_topk_int64_lengths_and_chunking_invariance():
    gen = torch.Generator().manual_seed(7)
    scores, lengths = hard_rows(gen, 96, 12)
    first = topk(scores, lengths.to(torch.int64), 12, group=1, **SMALL)
    assert torch.equal(first, expected(scores, lengths, 12)), "int64 lengths give a different result"
    # another chunking and grouping: the same bits (set and order), and a row alone gives its row of the batch
    other = dict(SMALL, chunk=32, finish_chunk=64)
    assert torch.equal(topk(scores, lengths, 12, group=4, **other), first), "chunking changed the bits"
    assert torch.equal(topk(scores[7:8], lengths[7:8], 12, group=2, **SMALL), first[7:8]), "not batch-invariant"
    for kw in (dict(GROUPS, group_size=8, chunk=32, batch=2),
               dict(GROUPS, group_size=8, chunk=32, batch=2, segment_histograms=True, compact_prefetch=True)):
        assert torch.equal(topk(scores, lengths.to(torch.int64), 12, **kw), first), f"groups {kw} differ from bound"


def test_bound_topk_emits_slots():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 90, generator=gen)
    lengths = torch.tensor([90, 40, 5], dtype=torch.int32)
    req = torch.tensor([1, 0, 1], dtype=torch.int32)
    table = torch.tensor([[3, -1, 0, 1, 2, 4], [5, 2, -1, 0, 1, 3]], dtype=torch.int32)  # 16-token blocks
    positions = topk(scores, lengths, 20, **SMALL)
    block = table[req.long()[:, None], (positions.clamp(min=0) // 16).long()]
    want = torch.where((positions >= 0) & (block >= 0), block * 16 + positions % 16, -1)
    for kw in (SMALL, dict(GROUPS, group_size=4), dict(SMALL, segment_histograms=True),
               dict(GROUPS, group_size=4, segment_histograms=True, compact_prefetch=True), REGISTERS):
        slots = topk(scores, lengths, 20, emit_slots=(req, table, 16), **kw)
        assert torch.equal(slots, want), f"{kw['method']}: slots differ from the positions mapped through the table"


def test_bound_topk_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="argument 'method' expected one of"):
        topk(torch.zeros(1, 4), torch.ones(1, dtype=torch.int32), 2, method="sort")


def test_auto_group_keeps_group_times_k_within_a_quarter_row():
    assert auto_group(131072, 2048, 1024) == 16
    assert auto_group(32768, 2048, 1024) == 4
    assert auto_group(4096, 2048, 1024) == 1
    assert auto_group(1 << 30, 2048, 1024) == 16
    assert [auto_group_size(w, 2048) for w in (131072, 32768, 4096)] == [16, 4, 1]


def test_bound_topk_uses_a_given_scratch_and_rejects_a_bad_one():
    gen = torch.Generator().manual_seed(5)
    scores, lengths = torch.randn(3, 70, generator=gen), torch.tensor([70, 33, 2], dtype=torch.int32)
    scratch = torch.full((3, 70), 7, dtype=torch.int32)
    got = topk(scores, lengths, 10, scratch=scratch, **SMALL)
    assert torch.equal(got, expected(scores, lengths, 10)), "a caller's scratch changed the result"
    assert not bool((scratch == 7).all()), "the caller's scratch was not used"
    with pytest.raises(ValueError, match="argument 'scratch' expected a contiguous"):
        topk(scores, lengths, 10, scratch=torch.zeros(3, 140, dtype=torch.int32)[:, ::2], **SMALL)


def test_groups_rejects_a_chunk_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="powers of two with chunk a multiple of the group size"):
        topk(torch.zeros(1, 64), torch.ones(1, dtype=torch.int32), 2, **dict(GROUPS, chunk=24, group_size=16))


def _keys(x):
    """fp32 -> the kernels' order-preserving uint32 keys as int64 (-0.0 as +0.0); -inf entries count as empty."""
    bits = torch.where(x == 0, torch.zeros_like(x), x).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 1 << 31, bits ^ 0xFFFFFFFF, bits | 1 << 31)


def _survivors_by_definition(scores, lengths, k, unit_max):
    """Per row: the valid entries with key >= L, where L = the top 16 bits of the k-th largest non-empty unit
    maximum over the WHOLE row (units from ``unit_max``), or 1 when fewer than k units are non-empty."""
    counts = []
    for row, length in zip(scores, lengths.tolist()):
        x = row.clone()
        x[length:] = float("-inf")
        maxima = unit_max(x)
        live = maxima[maxima != float("-inf")]
        bound = 1
        if live.numel() >= k:
            bound = int(_keys(live).sort(descending=True).values[k - 1]) >> 16 << 16
        valid = x != float("-inf")
        counts.append(int((valid & (_keys(x) >= bound)).sum()))
    return counts


@pytest.mark.parametrize("method", ["bound", "groups", "bound + segment histograms", "groups + segment histograms"])
def test_bound_on_causal_rows_is_as_tight_as_over_the_whole_row(method):
    """Rows shorter than the width (a causal prefill) reach only their first segments; the threshold reads
    only those. It must find the same bound as over every segment (so the same survivors), and the same set."""
    from dsahal.backends.triton_kernels import topk_bound, topk_groups

    gen = torch.Generator().manual_seed(11)
    width, k, chunk, group = 256, 5, 16, 2
    lengths = torch.tensor([0, 3, 4, 5, 9, 31, 32, 33, 63, 70, 100, 129, 200, 255, 256], dtype=torch.int32)
    scores = torch.randn(lengths.numel(), width, generator=gen)
    common = dict(chunk=chunk, finish_chunk=16, num_warps=1, finish_warps=1)
    histograms = method.endswith("histograms")
    if method.startswith("bound"):  # lane j of a segment: entries j, j + chunk, ... (group of them)
        launch, kw = topk_bound.topk_bound, dict(common, group=group, segment_histograms=histograms)

        def unit_max(x):
            return x.view(-1, group, chunk).amax(dim=1).flatten()
    else:  # groups of `group` consecutive entries
        launch, kw = topk_groups.topk_groups, dict(common, group_size=group, steps=2, batch=4,
                                                   segment_histograms=histograms)

        def unit_max(x):
            return x.view(-1, group).amax(dim=1)
    stats = {}
    out = torch.empty(lengths.numel(), k, dtype=torch.int32)
    got = launch(scores, lengths, k, out, False, lengths, lengths.view(1, -1), 1, stats=stats, **kw)
    assert torch.equal(got, expected(scores, lengths, k)), "the set differs from the reference"
    want = _survivors_by_definition(scores, lengths, k, unit_max)
    assert stats["survivors"].tolist() == want, f"survivors {stats['survivors'].tolist()} against {want}"


# ----------------------------------------------------------------------------------------------------
# The registers method (topk_registers): short rows whole in one program, the bound method's bits


REGISTERS = dict(method="registers", num_warps=1)


@pytest.mark.parametrize("width,k", [(200, 9), (160, 24), (64, 64), (40, 48), (64, 1), (96, 95), (17, 3), (256, 128)])
def test_registers_topk_matches_reference_and_the_bound_bits(width, k):
    gen = torch.Generator().manual_seed(width * 17 + k)
    scores, lengths = hard_rows(gen, width, k)
    got = topk(scores, lengths, k, **REGISTERS)
    want = expected(scores, lengths, k)
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"rows {bad} differ from the reference (width {width}, k {k})"
    assert torch.equal(got, topk(scores, lengths, k, **SMALL)), "not the bound method's bits"
    # a row alone gives its row of the batch; int64 lengths and other warps the same bits
    assert torch.equal(topk(scores[5:6], lengths[5:6], k, **REGISTERS), got[5:6]), "not batch-invariant"
    assert torch.equal(topk(scores, lengths.to(torch.int64), k, method="registers", num_warps=4), got)


def test_registers_topk_on_strided_rows_nans_and_extreme_keys():
    gen = torch.Generator().manual_seed(11)
    wide = torch.randn(4, 80, generator=gen)
    wide[0, :8] = torch.tensor([float("inf"), -float("inf"), 3.4e38, -3.4e38, 1e-45, -1e-45, 0.0, -0.0])
    scores = wide[:, 5:70]  # rows that do not start aligned, row stride 80
    lengths = torch.tensor([65, 65, 30, 2], dtype=torch.int32)
    got = topk(scores, lengths, 7, **REGISTERS)
    assert torch.equal(got, expected(scores.contiguous(), lengths, 7))
    assert torch.equal(got, topk(scores.contiguous(), lengths, 7, **SMALL))


def test_registers_topk_pads_past_the_width():  # (its slot emission: test_bound_topk_emits_slots)
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 90, generator=gen)
    lengths = torch.tensor([90, 40, 5], dtype=torch.int32)
    # k past the width (a context shorter than k): every valid entry, then -1 to column k - 1
    short = topk(scores, lengths, 130, **REGISTERS)
    assert torch.equal(short, expected(scores, lengths, 130))
    assert torch.equal(topk(scores[:, :0], torch.zeros(3, dtype=torch.int32), 4, **REGISTERS),
                       torch.full((3, 4), -1, dtype=torch.int32))


def test_registers_topk_names_a_row_too_wide_and_bad_warps():
    from dsahal.backends.triton_kernels.topk_registers import MAX_WIDTH

    with pytest.raises(ValueError, match=f"rows of at most {MAX_WIDTH} scores, got {MAX_WIDTH + 1}"):
        topk(torch.zeros(1, MAX_WIDTH + 1), torch.ones(1, dtype=torch.int32), 2, method="registers")
    with pytest.raises(ValueError, match="num_warps expected 1, 2, 4, 8 or 16, got 3"):
        topk(torch.zeros(1, 4), torch.ones(1, dtype=torch.int32), 2, method="registers", num_warps=3)
