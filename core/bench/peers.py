"""Peer libraries a user would call instead of dsahal, on the bench case's own inputs.

Each function returns ``{name: callable}`` (empty when the library is not installed or does not serve
the case), so the bench times the peer beside our op in the same run. A peer joins a row only after
its output agreed with ours on those inputs (:func:`agreeing`): a peer that computes something else is
reported, not timed.

FlashMLA (``pip install --no-deps sgl-flash-mla``; SM90 kernels through ``use_legacy=True``): sparse
decode on fp8_ds_mla pages (its "V32" format, byte for byte ours) and sparse prefill on bf16 latents. It
serves 64 or 128 heads: fewer are zero-padded to 64 before timing (the padding copy is not timed, which
favours the peer), so a 16-head row compares against FlashMLA's padded time.
"""
from __future__ import annotations

import torch

HEAD_TILES = (64, 128)
NOPE = 512


def _flash_mla():
    try:
        import flash_mla
    except Exception:  # noqa: BLE001 - absent, or built for another torch/GPU: no peer column
        return None
    return flash_mla


def _padded(q: torch.Tensor) -> torch.Tensor | None:
    heads = q.shape[1]
    tile = next((t for t in HEAD_TILES if t >= heads), None)
    if tile is None:
        return None
    if tile == heads:
        return q.contiguous()
    padded = torch.zeros((q.shape[0], tile, q.shape[2]), dtype=q.dtype, device=q.device)
    padded[:, :heads] = q
    return padded


def flashmla_decode(q, pages, softmax_scale: float):
    """FlashMLA's sparse decode on fp8_ds_mla ``pages [blocks, 64, 656]`` (contiguous) for bf16
    ``q [T, H, 576]``: a function ``slots [T, K] int32 -> o [T, Hp, 512]`` (heads padded to 64 or 128,
    padded ones included), or None where FlashMLA does not serve it."""
    module = _flash_mla()
    if not _serves(module, q, pages) or pages.shape[1] != 64 or pages.shape[-1] != 656:
        return None
    qp = _padded(q)
    if qp is None:
        return None
    meta = module.get_mla_metadata()[0]
    cache, q4 = pages.unsqueeze(2), qp.unsqueeze(1)

    def decode(slots):
        out, _ = module.flash_mla_with_kvcache(q4, cache, None, None, NOPE, meta, softmax_scale=softmax_scale,
                                               is_fp8_kvcache=True, indices=slots.unsqueeze(1), use_legacy=True,
                                               kv_format="V32")
        return out[:, 0]

    return decode


def _serves(module, q, pages) -> bool:
    return (module is not None and q.is_cuda and q.dtype == torch.bfloat16 and pages.is_contiguous()
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def _padding_label(q) -> str:
    tile = next((t for t in HEAD_TILES if t >= q.shape[1]), None)
    return "" if tile in (None, q.shape[1]) else f", heads padded to {tile}"


def flashmla_sparse_mla(q, pages, slots, kv_fmt: str, softmax_scale: float) -> dict:
    """FlashMLA on ``sparse_mla``'s inputs: q ``[T, H, 576]`` bf16, pages ``[blocks, 64, record]`` uint8
    (contiguous), slots ``[T, K]`` int32 (physical ``block * 64 + offset``, -1 skipped).
    Returns ``{"FlashMLA ...": fn}`` with ``fn() -> o [T, Hp, 512]`` (padded heads included)."""
    indices = slots.to(torch.int32)
    if kv_fmt == "fp8_ds_mla":
        decode = flashmla_decode(q, pages, softmax_scale)
        return {} if decode is None else {f"FlashMLA sparse decode{_padding_label(q)}": lambda: decode(indices)}
    module = _flash_mla()
    qp = _padded(q)
    if kv_fmt != "bf16" or qp is None or not _serves(module, q, pages):
        return {}
    kv = pages.view(torch.bfloat16).reshape(-1, 1, 576)
    prefill_indices = indices.unsqueeze(1)

    def prefill():
        return module.flash_mla_sparse_fwd(qp, kv, prefill_indices, softmax_scale, NOPE, use_legacy=True)[0]

    return {f"FlashMLA sparse prefill{_padding_label(q)}": prefill}


def agreeing(peers: dict, ours, heads: int, *, tol: float = 2e-2) -> tuple[dict, list[str]]:
    """The peers whose ``o`` (first ``heads`` heads) is within ``tol`` (relative norm) of ours.
    Returns (kept peers, one note per dropped peer)."""
    kept, notes = {}, []
    o_ours = ours[0] if isinstance(ours, tuple) else ours
    for name, fn in peers.items():
        try:
            o_peer = fn()
            o_peer = (o_peer[0] if isinstance(o_peer, tuple) else o_peer)[:, :heads]
            err = float((o_peer.double() - o_ours.double()).norm() / o_ours.double().norm().clamp_min(1e-30))
        except Exception as exc:  # noqa: BLE001 - a failing peer is reported, not timed
            notes.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
            continue
        if err <= tol:
            kept[name] = fn
        else:
            notes.append(f"{name}: output differs from ours (rel err {err:.2e}), not timed")
    return kept, notes
