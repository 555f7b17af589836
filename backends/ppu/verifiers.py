"""Per-op verifiers of the PPU backend: the limits of its implementations, stated as ``(ok, reason)``.

Each takes exactly the op's backend-facing arguments and reads only metadata (shapes, dtypes,
strides, devices), never tensor contents, so a call costs no device synchronisation. A call is
accepted when the path :mod:`.ops` will take for it (Triton kernel or portable torch) serves it;
a rejected call runs on the reference instead, logged once with the reason.
"""
from __future__ import annotations

from . import routes
from .portable_index import TOPK_MAX_WIDTH

OK = (True, "")
# The portable sparse MLA gathers one query row's selected latents at a time at worst:
# [K, 576] fp32. Above this many slots per row the gather alone passes 1 GiB.
SPARSE_MLA_MAX_SLOTS_PER_ROW = 1 << 19


def verify_topk(scores, lengths, k):
    if routes.takes_topk(scores, lengths, k)[0]:
        return OK  # the radix-select kernel has no width limit
    if scores.shape[1] >= TOPK_MAX_WIDTH:
        return False, f"scores width {scores.shape[1]} >= 2^24: the portable top-k orders indices through an fp32 key"
    return OK


def verify_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    if routes.takes_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale)[0]:
        return OK  # the kernel streams the slots: no gather tile
    if slots.shape[1] > SPARSE_MLA_MAX_SLOTS_PER_ROW:
        return False, (f"{slots.shape[1]} slots per row > {SPARSE_MLA_MAX_SLOTS_PER_ROW}: "
                       "the portable gathered latent tile would pass 1 GiB")
    return OK
