"""The exact DCP top-k merge with packed 32-bit candidates (DESIGN §3.4), exact on the raw fp32 scores.

Each rank ranks its local scores and sends only its best ``c = ceil(1.5·k/W)`` candidates as 32-bit
words (:mod:`.packing`: a score key truncated to ``32 - bit_length(N-1)`` bits, then the local id).
Every rank runs the same selection on the same gathered words, so every decision below is taken
identically on every rank without extra messages. A rank's local ranking (rounded key, then
smaller id) goes ``ranked = min(k + 1, N)`` words deep.

1. **First round.** Select the top-k of the gathered words by (rounded key, then smaller global
   position). Its k-th rounded key is the row's *threshold* ``tau``.
2. **Resend.** A rank's unsent entries all have rounded keys ``<=`` its last sent one. If that key
   is ``< tau`` the rank sent every entry with a key ``>= tau``; otherwise (or when fewer than k
   candidates were gathered) the rank is *flagged* and resends its local ranks ``c..ranked-1`` for
   those rows only. After it, ``tau`` is the true k-th largest rounded key of the row (truncated
   keys never exceed the truth, and a flagged rank now shows ``>= k`` entries ``>= tau``), every
   entry with a key ``> tau`` is known, and so is every entry with key ``== tau`` (the *band*),
   except on a rank whose ``(k+1)``-th word is still in the band: it "may overflow", holding band
   members past its ranking.
3. **Band round.** Truncation is monotonic (rounded(a) > rounded(b) implies a > b), so the
   ``A`` known entries above the band win and everything below it loses; ``m = k - A`` slots go to
   the band members with the best (raw score, then smaller global position). Rows whose band has
   at most ``m`` members, and no rank that may overflow, are done. For the other rows each rank
   sends, per row, either the raw fp32 scores of its known band members in word order (their ids
   are known from the words: 4 B each) or, when it may overflow or that is cheaper (its known band
   members ``> 2m``), its own ``m`` best band members as (fp32 score, local id) pairs (8 B each).
   A rank's band winners are among its own ``m`` best, so every rank picks the same ``m`` best.

Result: the same *set* as ``dsahal.ops.topk(gathered_raw_scores, lengths, k)`` in every row (tie
rule: smaller global position wins; -inf never selected; -1 padding last). Order: winners above the
band by (rounded key, position), then the band's winners by (raw score, position); best first
up to the rounding classes.

4. **The bound** (issue 20): never more bytes per rank than the generic merge (``8·T·k``). The local
   ranking is by raw score (then smaller id), so a rank's first ``k`` words are its exact local top-k.
   Where the band round would make some rank exceed the generic volume (heavy ties, scores differing
   only in bits the packing drops), the band rows are settled by the *completion* instead: each rank
   sends the words of its local ranks ``c..k-1`` the peers have not seen, plus the ``id_bits`` low bits
   of every one of its first ``k`` score keys, bit-packed; every rank then knows every rank's local
   top-k with raw scores, and the global winners are among them. Per row that is at most
   ``4·(k + 1) + k·id_bits/8`` bytes with the first round and the resend (< ``8·k`` for ``k >= 12``).
   Calls whose worst case (:func:`worst_case_exact_bytes`) would still exceed the generic merge (tiny
   ``k``) use the generic merge outright. Every choice depends only on gathered data or shapes, so every
   rank makes the same one; ``MergeStats.protocol`` records it.

Traffic per rank (payload it contributes, each reaching the ``W-1`` peers): ``4·(2 + T·c)`` bytes,
plus ``4·(ranked - c)`` per flagged row, plus the band round's ``4·|known band members|`` (or
``8·m``) per band row, or the completion's bytes instead of the band round's; the generic merge
contributes ``8·T·k``, the most this merge ever sends. At W = 8, k = 2048 with neither
resend nor band round: c = 384, 1,536 vs 16,384 bytes per row, 10.7x less.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from ..ops.collectives import group_rank_and_size
from . import collective
from .generic_merge import generic_topk_merge, rank_with_tie_rule
from .traffic import MergeStats, generic_payload_bytes, merge_traffic
from .packing import (
    MAX_ID_BITS,
    id_bits_for_width,
    pack_candidates,
    score_key,
    truncated_key,
    unpack_local_ids,
    wire_to_words,
    words_to_wire,
)

OVERSAMPLE = 1.5
HEADER_INTS = 2  # (local width N, k) travel with the candidates so mismatched ranks are caught
WORD_BYTES = 4

# exchange(payloads by rank computed in this process, int32 count of every rank, step name) -> W payloads
Exchange = Callable[[Mapping[int, torch.Tensor], Sequence[int], str], list]


@dataclass(frozen=True)
class MergePlan:
    """Sizes of one merge, identical on every rank (they depend only on ``k``, ``N`` and ``W``)."""

    world: int
    k: int
    width: int  # N, local score width
    id_bits: int
    candidates: int  # c, sent per row in the first round
    ranked: int  # min(k + 1, N): depth of the local ranking (first round + possible resend)
    pos_bits: int  # bits of a global position < W·N

    @property
    def key_bits(self) -> int:
        return 32 - self.id_bits

    @property
    def resend_width(self) -> int:
        return self.ranked - self.candidates


def plan_merge(k: int, width: int, world: int, oversample: float = OVERSAMPLE) -> MergePlan:
    """``c = min(ceil(oversample·k/W), k + 1, N)`` candidates per row; at ``c = min(k + 1, N)`` no resend can
    happen. The ranking goes one word past the top-k: whether that word is in the band tells every
    rank whether this one may hold band members it never sent."""
    ranked = min(k + 1, width)
    candidates = max(1, min(math.ceil(oversample * k / world), ranked))
    return MergePlan(world=world, k=k, width=width, id_bits=id_bits_for_width(width), candidates=candidates,
                     ranked=ranked, pos_bits=max(1, (world * width - 1).bit_length()))


def _raw_order(local_scores: torch.Tensor, valid: torch.Tensor, id_bits: int) -> torch.Tensor:
    """``[T, N]`` int64 sort keys in the single-device tie rule's order (raw score, then smaller local id):
    ``score_key << id_bits | (2**id_bits - 1 - id)`` (at most 55 bits), -1 where not a candidate."""
    ids = torch.arange(local_scores.shape[1], device=local_scores.device, dtype=torch.int64)
    order = (score_key(local_scores) << id_bits) | ((1 << id_bits) - 1 - ids)[None, :]
    return torch.where(valid, order, torch.full_like(order, -1))


def rank_locally(local_scores: torch.Tensor, local_lengths: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """``[T, N]`` fp32 scores -> ``[T, ranked]`` int64 words, best first; 0 = no candidate.

    Entries at or past ``local_lengths[t]`` and -inf entries are never candidates. The ranking is by
    *raw* score, then smaller local id (the tie rule): rounded keys still never increase along it (the
    truncation is monotone), which is all the first round and the band round rely on, and its first
    ``k`` words are exactly this rank's local top-k, which the bounded completion relies on.
    """
    valid = _valid_entries(local_scores, local_lengths)
    best = torch.topk(_raw_order(local_scores, valid, plan.id_bits), plan.ranked, dim=1, sorted=True)
    words = pack_candidates(local_scores, valid, plan.id_bits).gather(1, best.indices)
    return torch.where(best.values >= 0, words, torch.zeros_like(words))


def _valid_entries(local_scores: torch.Tensor, local_lengths: torch.Tensor) -> torch.Tensor:
    columns = torch.arange(local_scores.shape[1], device=local_scores.device)
    return (columns[None, :] < local_lengths.long()[:, None]) & (local_scores != float("-inf"))


def global_order(words: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """Words of every rank ``[W, T, n]`` -> ``[T, W·n]`` int64 global sort keys; -1 for padding.

    Key = (rounded score key, then ``2**pos_bits - 1 - global_position``): larger is better under
    the tie rule, and keys are distinct, so ``torch.topk`` picks the same set on every rank.
    """
    world, tokens, n = words.shape
    ranks = torch.arange(world, device=words.device, dtype=torch.int64)[:, None, None]
    positions = unpack_local_ids(words, plan.id_bits) * world + ranks
    keys = ((words >> plan.id_bits) << plan.pos_bits) | ((1 << plan.pos_bits) - 1 - positions)
    keys = torch.where(words == 0, torch.full_like(keys, -1), keys)
    return keys.permute(1, 0, 2).reshape(tokens, world * n)


def select_top(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest global keys per row, best first, ``[T, k]`` int64; -1 padding."""
    top = torch.topk(keys, min(k, keys.shape[1]), dim=1, sorted=True).values
    if top.shape[1] < k:
        top = torch.cat([top, top.new_full((top.shape[0], k - top.shape[1]), -1)], dim=1)
    return top


def threshold_keys(selected: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """``[T]`` int64 rounded score key (``word >> id_bits``) of the k-th selected; -1 when fewer than k."""
    last = selected[:, plan.k - 1]
    return torch.where(last >= 0, last >> plan.pos_bits, torch.full_like(last, -1))


def flag_resends(first_words: torch.Tensor, selected: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """``[W, T]`` bool: rank ``r`` may own winners or band members it did not send in row ``t``.

    True when ``r`` sent ``c`` real candidates, could have more (``c < ranked``), and the rounded
    score key of its last one is ``>=`` the threshold (or fewer than ``k`` were selected at all).
    """
    world, tokens, c = first_words.shape
    if plan.resend_width == 0:
        return torch.zeros((world, tokens), dtype=torch.bool, device=first_words.device)
    last = first_words[:, :, c - 1]
    return (last != 0) & ((last >> plan.id_bits) >= threshold_keys(selected, plan)[None, :])


def keys_to_positions(selected: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """Global keys -> ``[T, k]`` int32 global positions; -1 padding."""
    mask = (1 << plan.pos_bits) - 1
    return torch.where(selected >= 0, mask - (selected & mask), torch.full_like(selected, -1)).to(torch.int32)


def apply_resends(first: torch.Tensor, selected: torch.Tensor, flagged: torch.Tensor, parts: Sequence[torch.Tensor],
                  plan: MergePlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter each rank's resent words (wire int32, its flagged rows' ranks ``c..ranked-1``) and
    reselect the flagged rows.

    Returns:
        (every known word ``[W, T, ranked]`` int64, 0 where nothing was sent; ``[T, k]`` selected keys).
    """
    world, tokens, _ = first.shape
    extra = torch.zeros((world, tokens, plan.resend_width), dtype=torch.int64, device=first.device)
    for r, part in enumerate(parts):
        extra[r, flagged[r]] = wire_to_words(part).reshape(-1, plan.resend_width)
    known = torch.cat([first, extra], dim=2)
    rows = flagged.any(dim=0).nonzero().squeeze(1)
    selected = selected.clone()
    selected[rows] = select_top(global_order(known[:, rows], plan), plan.k)
    return known, selected


# ----------------------------------------------------------------------------- the band round

@dataclass(frozen=True)
class BandPlan:
    """The rows needing a band round and what each rank sends for them (identical on every rank).

    ``R`` band rows. ``threshold``, ``above``, ``slots``: ``[R]`` int64 (rounded key ``tau``, count
    of known entries above it, ``m = k - above``). ``sent``: ``[W, R]`` int64 band members each
    rank's known words hold. ``pairs``: ``[W, R]`` bool, the rank sends its ``m`` best band members
    as (score, id) pairs instead of its known members' scores. ``counts``: ``[W, R]`` int64 int32
    values each rank sends per row.
    """

    rows: torch.Tensor
    threshold: torch.Tensor
    above: torch.Tensor
    slots: torch.Tensor
    sent: torch.Tensor
    pairs: torch.Tensor
    counts: torch.Tensor


def plan_band(known: torch.Tensor, selected: torch.Tensor, plan: MergePlan) -> BandPlan:
    """Band rows of ``known`` ``[W, T, ranked]`` words after the resend, with ``selected`` ``[T, k]``."""
    threshold = threshold_keys(selected, plan)
    keys, real = known >> plan.id_bits, known != 0
    has_threshold = threshold >= 0
    in_band = real & (keys == threshold[None, :, None]) & has_threshold[None, :, None]
    sent = in_band.sum(dim=2)  # [W, T]
    above = (real & (keys > threshold[None, :, None])).sum(dim=(0, 2))
    slots = plan.k - above
    if plan.ranked > plan.k:  # its (k+1)-th word is in the band: it may hold more members past it
        may_overflow = in_band[:, :, plan.k]
    else:  # the ranking holds all N entries of a rank: nothing of it is unknown
        may_overflow = torch.zeros_like(sent, dtype=torch.bool)
    rows = (has_threshold & ((sent.sum(dim=0) > slots) | may_overflow.any(dim=0))).nonzero().squeeze(1)
    sent, slots = sent[:, rows], slots[rows]
    # Overflowing ranks must name their members; others do when m pairs are cheaper than all scores.
    pairs = may_overflow[:, rows] | (2 * slots[None, :] < sent)
    counts = torch.where(pairs, 2 * slots[None, :].expand_as(sent), sent)
    return BandPlan(rows=rows, threshold=threshold[rows], above=above[rows], slots=slots, sent=sent, pairs=pairs,
                    counts=counts)


def _band_ids_in_word_order(words: torch.Tensor, threshold: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """``[R, ranked]`` words of one rank -> ``[R, ranked]`` local ids of its band members first (word
    order), then meaningless ids clamped into ``[0, N)``."""
    in_band = (words != 0) & ((words >> plan.id_bits) == threshold[:, None])
    order = torch.sort((~in_band).to(torch.int8), dim=1, stable=True).indices
    return unpack_local_ids(words.gather(1, order), plan.id_bits).clamp(0, plan.width - 1)


def _best_band_members(scores: torch.Tensor, lengths: torch.Tensor, threshold: torch.Tensor, count: int,
                       plan: MergePlan) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``count`` best band members of each row by (raw score, then smaller local id).

    Args:
        scores: ``[R, N]`` fp32; lengths: ``[R]``; threshold: ``[R]`` int64.

    Returns:
        (``[R, count]`` fp32 scores, ``[R, count]`` int64 local ids). The plan asks only where the
        rank holds at least that row's ``m`` members; entries past them are meaningless.
    """
    member = _valid_entries(scores, lengths) & ((truncated_key(scores, plan.id_bits) >> plan.id_bits)
                                                == threshold[:, None])
    ids = torch.arange(scores.shape[1], device=scores.device, dtype=torch.int64)
    order = (score_key(scores) << plan.id_bits) | ((1 << plan.id_bits) - 1 - ids)[None, :]
    best = torch.topk(torch.where(member, order, torch.full_like(order, -1)), count, dim=1).indices
    return scores.gather(1, best), best


def band_payload(local_scores: torch.Tensor, local_lengths: torch.Tensor, own_words: torch.Tensor, rank: int,
                 band: BandPlan, plan: MergePlan) -> torch.Tensor:
    """What ``rank`` sends in the band round: ``[band.counts[rank].sum()]`` int32, row after row.

    Args:
        local_scores: ``[T, N]`` fp32; local_lengths: ``[T]``; own_words: ``[T, ranked]`` int64 (this
            rank's local ranking).
    """
    counts, pairs, slots = band.counts[rank], band.pairs[rank], band.slots
    width = max(plan.ranked, 2 * int(slots.max()))  # widest row: all known words, or m pairs
    scores = local_scores[band.rows]
    ids = _band_ids_in_word_order(own_words[band.rows], band.threshold, plan)
    content = _pad_columns(scores.gather(1, ids).view(torch.int32), width)
    chosen = pairs.nonzero().squeeze(1)
    if chosen.numel():
        best_scores, best_ids = _best_band_members(scores[chosen], local_lengths[band.rows[chosen]],
                                                   band.threshold[chosen], int(slots[chosen].max()), plan)
        m = slots[chosen, None]
        columns = torch.arange(width, device=scores.device)[None, :]
        take = torch.where(columns < m, columns, columns - m).clamp(0, best_ids.shape[1] - 1)
        content[chosen] = torch.where(columns < m, best_scores.view(torch.int32).gather(1, take),
                                      best_ids.to(torch.int32).gather(1, take))
    return content[torch.arange(width, device=scores.device)[None, :] < counts[:, None]]


def _pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """``[R, n]`` -> ``[R, width]`` (``width >= n``), zeros on the right."""
    return torch.cat([x, x.new_zeros((x.shape[0], width - x.shape[1]))], dim=1)


def resolve_band(parts: Sequence[torch.Tensor], known: torch.Tensor, band: BandPlan, plan: MergePlan
                 ) -> torch.Tensor:
    """The band's winners from every rank's band payload: ``[R, max m]`` int64 global positions, best
    first by (raw score, then smaller position), -1 past each row's ``m``."""
    world = len(parts)
    rows = band.rows.numel()
    width = max(plan.ranked, 2 * int(band.slots.max()))
    columns = torch.arange(width, device=known.device)[None, :]
    pos_mask = (1 << plan.pos_bits) - 1
    candidates = []
    for r, part in enumerate(parts):
        content = torch.zeros((rows, width), dtype=torch.int32, device=known.device)
        content[columns < band.counts[r][:, None]] = part.to(known.device)
        # Scores in word order (ids from the known words), or m scores then their m local ids.
        pairs, m = band.pairs[r][:, None], band.slots[:, None]
        named = content.gather(1, (columns + m).clamp(max=width - 1)).long()
        in_words = _pad_columns(_band_ids_in_word_order(known[r, band.rows], band.threshold, plan), width)
        local = torch.where(pairs, named, in_words)
        count = torch.where(pairs, m, band.sent[r][:, None])
        raw_key = score_key(content.view(torch.float32))
        order = (raw_key << plan.pos_bits) | (pos_mask - (local * world + r))
        candidates.append(torch.where(columns < count, order, torch.full_like(order, -1)))
    top = torch.topk(torch.cat(candidates, dim=1), int(band.slots.max()), dim=1).values
    winners = pos_mask - (top & pos_mask)
    keep = torch.arange(top.shape[1], device=top.device)[None, :] < band.slots[:, None]
    return torch.where(keep, winners, torch.full_like(winners, -1))


def insert_band_winners(positions: torch.Tensor, band: BandPlan, winners: torch.Tensor) -> torch.Tensor:
    """Band rows of ``positions`` ``[T, k]`` int32: the ``above`` selected entries, then the band's winners."""
    positions = positions.clone()
    columns = torch.arange(positions.shape[1], device=positions.device)[None, :]
    above = band.above[:, None]
    from_band = winners.gather(1, (columns - above).clamp(0, winners.shape[1] - 1)).to(positions.dtype)
    positions[band.rows] = torch.where(columns < above, positions[band.rows], from_band)
    return positions


def first_round_payload_bytes(rows: int, plan: MergePlan) -> int:
    """Bytes one rank contributes to the first round (header + ``rows·c`` words): the total when
    neither a resend nor a band round happens."""
    return WORD_BYTES * (HEADER_INTS + rows * plan.candidates)


# ----------------------------------------------------------------------------- the bounded completion

def completion_width(plan: MergePlan) -> int:
    """``min(k, ranked)``: how deep the completion makes each rank's raw ranking known (its local top-k)."""
    return min(plan.k, plan.ranked)


def _remainder_words(count: int, plan: MergePlan) -> int:
    """int32 words holding ``count`` remainders of ``id_bits`` bits each, packed densely."""
    return -(-count * plan.id_bits // 32)


def completion_counts(known_depth: torch.Tensor, plan: MergePlan) -> list[int]:
    """int32 values each rank sends in the completion of ``R`` rows whose ranking is known to
    ``known_depth`` ``[W, R]`` words (c, or ``ranked`` for a rank that resent that row): the words of its
    local ranks ``depth..k-1``, then the ``id_bits`` truncated-away bits of every one of its first ``k``
    words' score keys, bit-packed."""
    depth = completion_width(plan)
    rows = known_depth.shape[1]
    missing = (depth - known_depth).clamp(min=0).sum(dim=1)
    return [int(n) + _remainder_words(rows * depth, plan) for n in missing.tolist()]


def worst_case_exact_bytes(rows: int, plan: MergePlan) -> int:
    """The most one rank can contribute to the exact merge of ``rows`` rows: the first round, a resend in
    every row, and the completion of every row (the band round is only used where it costs less than the
    completion would). If this exceeds the generic merge's bytes, the call uses the generic merge."""
    return WORD_BYTES * (HEADER_INTS + rows * plan.ranked + _remainder_words(rows * completion_width(plan), plan))


def _pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``[n]`` int64 values in ``[0, 2**bits)`` -> ``[ceil(n·bits/32)]`` int32 wire words, densely packed."""
    if bits == 0 or values.numel() == 0:
        return values.new_zeros(_remainder_words(values.numel(), MergePlan(1, 1, 1, bits, 1, 1, 1)),
                                dtype=torch.int32)
    shifts = torch.arange(bits, device=values.device)
    stream = ((values[:, None] >> shifts) & 1).reshape(-1)
    stream = torch.cat([stream, stream.new_zeros((-stream.numel()) % 32)]).reshape(-1, 32)
    return words_to_wire((stream << torch.arange(32, device=values.device)).sum(dim=1))


def _unpack_bits(wire: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`_pack_bits`: ``count`` int64 values."""
    if bits == 0 or count == 0:
        return torch.zeros(count, dtype=torch.int64, device=wire.device)
    stream = ((wire_to_words(wire)[:, None] >> torch.arange(32, device=wire.device)) & 1).reshape(-1)
    stream = stream[:count * bits].reshape(count, bits)
    return (stream << torch.arange(bits, device=wire.device)).sum(dim=1)


def completion_payload(local_scores: torch.Tensor, own_words: torch.Tensor, depth: torch.Tensor,
                       rows: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """What one rank sends in the completion: ``[completion_counts(...)[rank]]`` int32.

    Args:
        local_scores: ``[T, N]`` fp32; own_words: ``[T, ranked]`` int64, its raw ranking;
        depth: ``[R]`` words of each completed row the peers know already; rows: ``[R]`` the rows.
    """
    width = completion_width(plan)
    words = own_words[rows, :width]
    columns = torch.arange(width, device=words.device)[None, :]
    missing = words[columns >= depth[:, None]]  # row after row, the words peers have not seen
    ids = unpack_local_ids(words, plan.id_bits).clamp(0, plan.width - 1)
    remainder = score_key(local_scores[rows].gather(1, ids)) & ((1 << plan.id_bits) - 1)
    remainder = torch.where(words != 0, remainder, torch.zeros_like(remainder))
    return torch.cat([words_to_wire(missing), _pack_bits(remainder.reshape(-1), plan.id_bits)])


def resolve_completion(parts: Sequence[torch.Tensor], known: torch.Tensor, depth: torch.Tensor,
                       rows: torch.Tensor, plan: MergePlan) -> torch.Tensor:
    """``[R, k]`` int64 global positions of the completed rows, best first by (raw score, position), -1
    padding: every rank's local top-k is now known with its raw scores, and every global winner is among
    its own rank's local top-k."""
    world = len(parts)
    width = completion_width(plan)
    columns = torch.arange(width, device=known.device)[None, :]
    pos_mask = (1 << plan.pos_bits) - 1
    candidates = []
    for r, part in enumerate(parts):
        part = part.to(known.device)
        words = known[r, rows, :width].clone()
        fill = columns >= depth[r][:, None]
        count = int(fill.sum())
        words[fill] = wire_to_words(part[:count])
        remainder = _unpack_bits(part[count:], rows.numel() * width, plan.id_bits).reshape(rows.numel(), width)
        raw_key = ((words >> plan.id_bits) << plan.id_bits) | remainder
        positions = unpack_local_ids(words, plan.id_bits) * world + r
        order = (raw_key << plan.pos_bits) | (pos_mask - positions)
        candidates.append(torch.where(words != 0, order, torch.full_like(order, -1)))
    top = select_top(torch.cat(candidates, dim=1), plan.k)
    return torch.where(top >= 0, pos_mask - (top & pos_mask), torch.full_like(top, -1))


# ----------------------------------------------------------------------------- the generic fallback

def _local_topk(local_scores: torch.Tensor, local_lengths: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, k]`` local ids of the raw local top-k under the tie rule, -1 padded (the generic fallback's)."""
    width = local_scores.shape[1]
    order = _raw_order(local_scores, _valid_entries(local_scores, local_lengths), id_bits_for_width(width))
    best = torch.topk(order, min(k, width), dim=1, sorted=True)
    ids = torch.where(best.values >= 0, best.indices, torch.full_like(best.indices, -1))
    if ids.shape[1] < k:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], k - ids.shape[1]), -1)], dim=1)
    return ids


def _generic_stats(world: int, rows: int, k: int) -> MergeStats:
    return MergeStats(world=world, rows=rows, k=k, candidates=k, key_bits=32, first_round_bytes=0, resend_bytes=0,
                      resend_rows=(0,) * world, generic_bytes=generic_payload_bytes(rows, k), protocol="generic")


# ----------------------------------------------------------------------------- the algorithm

def _merge_after_first_round(first: torch.Tensor, mine: Mapping[int, tuple], plan: MergePlan, exchange: Exchange
                             ) -> tuple[torch.Tensor, list[MergeStats]]:
    """Steps 1-3 of the module docstring from the gathered first-round words ``[W, T, c]``, with the
    bound: where the band round would make some rank send more than the generic merge, the band rows are
    settled by the completion instead (every rank's local top-k made known with raw scores).

    ``mine``: rank -> (local scores ``[T, N]``, local lengths ``[T]``, local ranking ``[T, ranked]``)
    for the rank(s) this process computes payloads for. Returns positions and per-rank stats.
    """
    world, tokens, c = first.shape
    selected = select_top(global_order(first, plan), plan.k)
    flagged = flag_resends(first, selected, plan)
    resend_rows = tuple(flagged.sum(dim=1).tolist())
    resend_counts = [n * plan.resend_width for n in resend_rows]
    known = torch.cat([first, first.new_zeros((world, tokens, plan.resend_width))], dim=2)
    if any(resend_counts):  # the same decision on every rank: flags come from identical gathered data
        payloads = {r: words_to_wire(ranked[flagged[r], c:]).reshape(-1) for r, (_, _, ranked) in mine.items()}
        parts = exchange(payloads, resend_counts, "topk_merge resend")
        known, selected = apply_resends(first, selected, flagged, parts, plan)
    positions = keys_to_positions(selected, plan)
    band = plan_band(known, selected, plan)
    band_counts = band.counts.sum(dim=1).tolist()
    completion_counts_ = [0] * world
    protocol = "exact"
    if band.rows.numel():
        spent = [WORD_BYTES * (HEADER_INTS + tokens * c + resend_counts[r]) for r in range(world)]
        depth = torch.where(flagged[:, band.rows], plan.ranked, c)  # [W, R] words the peers know
        completion = completion_counts(depth, plan)
        band_total = max(spent[r] + WORD_BYTES * band_counts[r] for r in range(world))
        completion_total = max(spent[r] + WORD_BYTES * completion[r] for r in range(world))
        if completion_total < band_total and band_total > generic_payload_bytes(tokens, plan.k):
            protocol, completion_counts_, band_counts = "exact+completion", completion, [0] * world
            payloads = {r: completion_payload(scores, ranked, depth[r], band.rows, plan)
                        for r, (scores, _, ranked) in mine.items()}
            parts = exchange(payloads, completion, "topk_merge completion")
            positions = positions.clone()
            positions[band.rows] = resolve_completion(parts, known, depth, band.rows, plan).to(positions.dtype)
        else:
            payloads = {r: band_payload(scores, lengths, ranked, r, band, plan)
                        for r, (scores, lengths, ranked) in mine.items()}
            parts = exchange(payloads, band_counts, "topk_merge band round")
            positions = insert_band_winners(positions, band, resolve_band(parts, known, band, plan))
    stats = [MergeStats(world=world, rows=tokens, k=plan.k, candidates=c, key_bits=plan.key_bits,
                        first_round_bytes=first_round_payload_bytes(tokens, plan),
                        resend_bytes=WORD_BYTES * resend_counts[r], resend_rows=resend_rows,
                        band_bytes=WORD_BYTES * band_counts[r], band_rows=int(band.rows.numel()),
                        completion_bytes=WORD_BYTES * completion_counts_[r], protocol=protocol)
             for r in range(world)]
    return positions, stats


def uses_generic(rows: int, plan: MergePlan) -> bool:
    """Whether a call of ``rows`` rows goes straight to the generic merge: the exact protocol's worst case
    (:func:`worst_case_exact_bytes`) would exceed the generic merge's bytes (tiny ``k``, where the header
    and the resend outweigh the packing). Depends on shapes only, so every rank decides the same."""
    return worst_case_exact_bytes(rows, plan) > generic_payload_bytes(rows, plan.k)


def _check_headers(headers: torch.Tensor, plan: MergePlan) -> None:
    expected = torch.tensor([plan.width, plan.k], dtype=headers.dtype)
    bad = [r for r in range(headers.shape[0]) if not torch.equal(headers[r].cpu(), expected)]
    if bad:
        listing = ", ".join(f"rank {r}: N={int(headers[r, 0])}, k={int(headers[r, 1])}" for r in range(len(headers)))
        raise ValueError(f"dsahal.topk_merge: every rank must pass the same local width N and k; got {listing}")


def exact_topk_merge(local_scores: torch.Tensor, local_lengths: torch.Tensor, k: int, group=None) -> torch.Tensor:
    """Backend signature of ``dsahal.ops.topk_merge``; see that op and this module's docstring.

    Args:
        local_scores: ``[T, N]`` fp32 (same ``T``, ``N`` on every rank); local_lengths: ``[T]`` int.

    Returns:
        ``[T, k]`` int32 global positions (``local * W + rank``), the set of the single-device top-k
        of the raw scores, -1 padding. Collective.
    """
    rank, world = group_rank_and_size(group)
    tokens, width = local_scores.shape
    # Widths the 32-bit words cannot carry (every rank has the same N: the op checks it), decided without talking:
    if width == 0:  # an empty shard on every rank: no candidate anywhere
        return torch.full((tokens, k), -1, dtype=torch.int32, device=local_scores.device)
    if width > 1 << MAX_ID_BITS:  # ids past 23 bits: the generic merge sends ids apart from the scores
        positions = generic_topk_merge(local_scores, local_lengths, k, group)
        merge_traffic.record(_generic_stats(world, tokens, k))
        return positions
    plan = plan_merge(k, width, world)
    if uses_generic(tokens, plan):
        positions = generic_topk_merge(local_scores, local_lengths, k, group, local_topk=_local_topk)
        merge_traffic.record(_generic_stats(world, tokens, k))
        return positions
    ranked = rank_locally(local_scores, local_lengths, plan)
    header = torch.tensor([plan.width, plan.k], dtype=torch.int32, device=local_scores.device)
    message = torch.cat([header, words_to_wire(ranked[:, :plan.candidates]).reshape(-1)])
    gathered = collective.all_gather(message, group, "topk_merge first round")  # [W, 2 + T·c]
    _check_headers(gathered[:, :HEADER_INTS], plan)
    first = wire_to_words(gathered[:, HEADER_INTS:]).reshape(world, tokens, plan.candidates)

    def exchange(payloads, counts, what):
        return collective.all_gather_varying(payloads[rank], list(counts), group, what)

    positions, stats = _merge_after_first_round(first, {rank: (local_scores, local_lengths, ranked)}, plan, exchange)
    merge_traffic.record(stats[rank])
    return positions


def merge_in_process(local_scores: Sequence[torch.Tensor], local_lengths: Sequence[torch.Tensor], k: int
                     ) -> tuple[torch.Tensor, list[MergeStats]]:
    """The same algorithm for ``W = len(local_scores)`` simulated ranks in one process (no collectives).

    Used to check exactness at any ``W`` cheaply and to compute traffic analytically; the gloo tests
    check that :func:`exact_topk_merge` on real ranks returns the same.

    Returns:
        (``[T, k]`` int32 global positions, one :class:`MergeStats` per simulated rank).
    """
    world = len(local_scores)
    plan = plan_merge(k, local_scores[0].shape[1], world)
    tokens = local_scores[0].shape[0]
    if uses_generic(tokens, plan):  # each rank's raw local top-k, ranked together as the generic merge does
        local = [_local_topk(s, n, k).long() for s, n in zip(local_scores, local_lengths)]
        scores = torch.cat([torch.where(ids >= 0, s.gather(1, ids.clamp_min(0)), float("-inf"))
                            for s, ids in zip(local_scores, local)], dim=1)
        ids = torch.cat([torch.where(ids >= 0, ids * world + r, torch.full_like(ids, torch.iinfo(torch.int32).max))
                         for r, ids in enumerate(local)], dim=1)
        return rank_with_tie_rule(scores, ids, k).to(torch.int32), [_generic_stats(world, tokens, k)] * world
    mine = {r: (s, n, rank_locally(s, n, plan)) for r, (s, n) in enumerate(zip(local_scores, local_lengths))}
    first = torch.stack([mine[r][2][:, :plan.candidates] for r in range(world)])

    def exchange(payloads, counts, what):
        for r in range(world):  # the sizes every rank agreed on must be what each one built
            if payloads[r].numel() != counts[r]:
                raise RuntimeError(f"dsahal.topk_merge: {what}: rank {r} built {payloads[r].numel()} values, "
                                   f"the plan says {counts[r]}")
        return [payloads[r] for r in range(world)]

    return _merge_after_first_round(first, mine, plan, exchange)
