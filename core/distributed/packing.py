"""32-bit packing of a (score, local id) candidate for the exact DCP top-k merge.

A candidate travels as one 32-bit word::

    word = (score_key(score) >> id_bits) << id_bits  |  (2**id_bits - 1 - local_id)

``score_key`` maps fp32 monotonically onto uint32 (the usual sign-flip trick, ``-0.0`` first made
``+0.0`` so equal floats get equal keys). Keeping its top ``key_bits = 32 - id_bits`` bits is the
*rounded key*. It groups fp32 values into classes (same sign, same magnitude truncated to
``key_bits - 9`` mantissa bits; ``id_bits = 16`` gives bfloat16's classes). Truncation is monotone:
a larger rounded key always means a larger raw score, so the words order candidates exactly
*between* classes; *within* a class they are ordered by local id only. The merge therefore trusts
the words above and below the threshold's class and settles that one class (the *band*) with raw
fp32 scores in a band round (:mod:`.merge`): its result does not depend on the rounding.

Storing ``2**id_bits - 1 - local_id`` makes a larger word mean "higher rounded key, then smaller
local id", so one unsigned comparison ranks a rank's candidates. Word 0 is never a real candidate
(``id_bits <= 23`` keeps every finite key >= 2**23) and marks padding.

``id_bits = bit_length(N - 1)`` for a local score width ``N``: all bits not needed for ids carry
score, so shorter shards get finer classes (smaller bands). At ``N = 131072`` (1M context over
W = 8) 15 key bits keep 6 mantissa bits; at ``N = 65536`` bf16's 7; at N = 128, 25 key bits keep 16.
"""
from __future__ import annotations

import torch

UINT32_MASK = 0xFFFFFFFF
MAX_ID_BITS = 23  # keeps the key of -FLT_MAX (0x00800000) nonzero after truncation: word 0 stays padding


def id_bits_for_width(width: int) -> int:
    """Bits needed for a local id in ``[0, width)``; raises beyond ``2**23`` local tokens."""
    if width < 1:
        raise ValueError(f"dsahal.topk_merge: local score width expected >= 1, got {width}")
    bits = (int(width) - 1).bit_length()
    if bits > MAX_ID_BITS:
        raise ValueError(f"dsahal.topk_merge: local score width expected <= 2**{MAX_ID_BITS} "
                         f"(ids and scores share 32 bits), got {width}")
    return bits


def score_key(scores: torch.Tensor) -> torch.Tensor:
    """Order-preserving uint32 key of fp32 ``scores`` (as int64 in ``[0, 2**32)``); -0.0 keys as +0.0."""
    canonical = scores.float() + 0.0  # -0.0 + 0.0 == +0.0: equal floats must get equal keys
    bits = canonical.contiguous().view(torch.int32).long() & UINT32_MASK
    negative = bits >= 0x80000000
    return torch.where(negative, bits ^ UINT32_MASK, bits | 0x80000000)


def key_to_score(keys: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`score_key`: int64 keys in ``[0, 2**32)`` to fp32."""
    positive = keys >= 0x80000000
    bits = torch.where(positive, keys & 0x7FFFFFFF, keys ^ UINT32_MASK)
    bits = torch.where(bits >= 0x80000000, bits - (1 << 32), bits)  # back to signed int32 range
    return bits.to(torch.int32).view(torch.float32)


def truncated_key(scores: torch.Tensor, id_bits: int) -> torch.Tensor:
    """The rounded key: ``score_key(scores)`` with its low ``id_bits`` bits cleared (int64)."""
    return (score_key(scores) >> id_bits) << id_bits


def round_scores_for_merge(scores: torch.Tensor, local_width: int) -> torch.Tensor:
    """The lowest fp32 value of each score's rounding class at local width ``N = local_width``: scores
    with equal results share a rounded key (``32 - bit_length(N - 1)`` bits) in the merge's words.
    ``-inf`` stays ``-inf``; finite stays finite.

    Not the merge's result any more: the merge returns the top-k of the *raw* scores (its band round
    settles each class). Kept to describe and construct rounding collisions (tests, analysis).
    """
    rounded = key_to_score(truncated_key(scores, id_bits_for_width(local_width)))
    return torch.where(scores == float("-inf"), scores, rounded)


def pack_candidates(scores: torch.Tensor, valid: torch.Tensor, id_bits: int) -> torch.Tensor:
    """Words for every local entry (column index = local id); 0 where ``valid`` is False.

    Args:
        scores: ``[T, N]`` fp32; valid: ``[T, N]`` bool.

    Returns:
        ``[T, N]`` int64 words in ``[0, 2**32)``; larger = better under the tie rule.
    """
    ids = torch.arange(scores.shape[1], device=scores.device, dtype=torch.int64)
    words = truncated_key(scores, id_bits) | ((1 << id_bits) - 1 - ids)[None, :]
    return torch.where(valid, words, torch.zeros_like(words))


def words_to_wire(words: torch.Tensor) -> torch.Tensor:
    """int64 words in ``[0, 2**32)`` to int32 (two's complement), the dtype every collective carries."""
    return torch.where(words >= 0x80000000, words - (1 << 32), words).to(torch.int32)


def wire_to_words(wire: torch.Tensor) -> torch.Tensor:
    """int32 wire values back to int64 words in ``[0, 2**32)``."""
    return wire.long() & UINT32_MASK


def unpack_local_ids(words: torch.Tensor, id_bits: int) -> torch.Tensor:
    """Local id of each word (int64); meaningless where the word is 0 (padding)."""
    mask = (1 << id_bits) - 1
    return mask - (words & mask)
