"""Verifiers of the PPU backend's ``portable`` routes: their limits, stated as ``(ok, reason)``
(the ``triton`` routes are verified by :mod:`.routes`).

Each takes exactly the op's arguments and reads only metadata (shapes, dtypes, strides, devices),
never tensor contents, so a call costs no device synchronisation; a call both routes decline runs
on the reference instead, logged once with the reason.
"""
from __future__ import annotations

from .portable_index import TOPK_MAX_WIDTH

OK = (True, "")
# The portable sparse MLA gathers one query row's selected latents at a time at worst:
# [K, 576] fp32. Above this many slots per row the gather alone passes 1 GiB.
SPARSE_MLA_MAX_SLOTS_PER_ROW = 1 << 19


def portable_topk(scores, lengths, k):
    if scores.shape[1] >= TOPK_MAX_WIDTH:
        return False, f"scores width {scores.shape[1]} >= 2^24: the portable top-k orders indices through an fp32 key"
    return OK


def portable_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if slots.shape[1] > SPARSE_MLA_MAX_SLOTS_PER_ROW:
        return False, (f"{slots.shape[1]} slots per row > {SPARSE_MLA_MAX_SLOTS_PER_ROW}: "
                       "the portable gathered latent tile would pass 1 GiB")
    return OK
