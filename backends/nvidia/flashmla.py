"""FlashMLA's SM90 sparse kernels as routes of ``sparse_mla`` (``pip install --no-deps sgl-flash-mla``).

Two kernels of the ``flash_mla`` package (its legacy, SM90 half: ``use_legacy=True``):

- sparse decode, ``flash_mla_with_kvcache(indices=...)`` on ``fp8_ds_mla`` pages, which are byte for
  byte FlashMLA's "V32" format (512 e4m3, 4 fp32 tile scales, 64 bf16 RoPE: 656 B per token);
- sparse prefill, ``flash_mla_sparse_fwd`` on bf16 latents, which it reads as one contiguous
  ``[tokens, 1, 576]`` array.

Both serve 64 or 128 query heads only; fewer heads are zero-padded up to 64 (paying the compute of 64).
Our slots are FlashMLA's indices (``block * block_tokens + offset``). FlashMLA's decode kernel treats
only -1 as invalid and checks no upper bound, so every call first rewrites the slot list as int32 with
anything outside ``[0, num_slots)`` set to -1, padded with -1 to a multiple of :data:`TOPK_MULTIPLE`:
one small elementwise pass (``T × k × 4`` bytes each way) that keeps a bad slot from becoming an
out-of-bounds read.

Batch invariance (``DSAHAL_BATCH_INVARIANT=1``). The sparse decode kernel is a persistent split-KV
kernel: each of its ``num_sm_parts`` CTAs walks a range of (row, 64-slot block) pairs that FlashMLA's
scheduler cuts from the whole batch, so by default a row's reduction order depends on the batch. The
kernel takes the schedule as a tensor (``DecodingSchedMeta``: begin/end row, begin/end block, split
flags), so in that mode we hand it a schedule of whole rows (:func:`_whole_rows_schedule`): part ``i``
owns rows ``[i·T/P, (i+1)·T/P)`` from their first block to their last, none split, so each row is
reduced alone in one CTA in slot order and written directly (the combine pass skips unsplit rows). The
sparse prefill kernel runs one CTA per (query token, 64-head block) over that token's whole top-k list
in order, with no split and no atomics (``csrc/sm90/prefill/sparse/phase1.cuh``: ``blockIdx.x`` is
``s_q × h_q / B_H``), so it serves that mode as it is. Both are certified by the conformance property
``sparse_mla_rows_do_not_depend_on_the_batch`` on the H200.

The package's metadata pins a torch newer than most users run; its stable-ABI build loads on older
torch, which is why it is installed with ``--no-deps`` and probed here at run time, never required.
"""
from __future__ import annotations

import importlib.util
from collections import OrderedDict
from importlib.metadata import PackageNotFoundError, version

import torch

from . import config

DISTRIBUTION = "sgl-flash-mla"
HEAD_TILES = (64, 128)  # the only h_q the SM90 kernels take
TOPK_MULTIPLE = 128  # slot lists padded with -1 to this multiple (the kernels step 64 slots at a time)
DECODE_BLOCK_TOKENS = (64,)  # page sizes checked on the H200 for the V32 decode kernel
NOPE, LATENT = 512, 576
DS_MLA_BYTES = 656
OK = (True, "")

_load_error: str | None = None
_flash_mla = None


def _module():
    """The imported ``flash_mla`` package, or None (and why in :data:`_load_error`)."""
    global _flash_mla, _load_error
    if _flash_mla is None and _load_error is None:
        try:
            import flash_mla

            if not flash_mla.has_legacy():
                raise RuntimeError("this build has no legacy (SM90) kernels")
            _flash_mla = flash_mla
        except Exception as exc:  # noqa: BLE001 - any failure to load means "route unavailable, here is why"
            _load_error = f"{type(exc).__name__}: {exc}"
    return _flash_mla


def installed_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "not installed"


def probe() -> tuple[bool, str]:
    """Available on an SM90 GPU with ``flash_mla`` importable and its legacy kernels present."""
    if importlib.util.find_spec("flash_mla") is None:
        return False, f"{DISTRIBUTION} is not installed (pip install --no-deps {DISTRIBUTION})"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    capability = torch.cuda.get_device_capability(0)
    if capability != (9, 0):
        return False, f"FlashMLA's legacy sparse kernels are SM90 (Hopper) only; this GPU is sm{capability[0]}{capability[1]}"
    if _module() is None:
        return False, f"{DISTRIBUTION} {installed_version()} does not load: {_load_error}"
    return True, f"{DISTRIBUTION} {installed_version()} (SM90 legacy kernels)"


def _common(q, kv_pages, slots) -> tuple[bool, str]:
    if q.dtype != torch.bfloat16:
        return False, f"FlashMLA takes bf16 queries, got {str(q.dtype).replace('torch.', '')}"
    heads = q.shape[1]
    if heads > HEAD_TILES[-1]:
        return False, f"FlashMLA serves at most {HEAD_TILES[-1]} heads, got {heads}"
    if not (q.is_cuda and kv_pages.is_cuda and slots.is_cuda):
        return False, "FlashMLA needs CUDA tensors"
    if q.shape[0] == 0 or slots.shape[1] == 0:
        return False, "an empty call (no tokens or no slots) needs no kernel"
    if q.stride(-1) != 1:
        return False, "q needs unit stride in its last dim"
    return OK


def decode_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The V32 sparse decode kernel: fp8_ds_mla pages of 64 tokens, records back to back in a block (a standalone
    cache or a layer's pages in the packed pool), bf16 queries."""
    if kv_fmt != "fp8_ds_mla":
        return False, f"FlashMLA's SM90 sparse decode reads fp8_ds_mla (V32) pages, not {kv_fmt!r}"
    block_tokens = kv_pages.shape[1]
    if block_tokens not in DECODE_BLOCK_TOKENS:
        return False, f"pages of {block_tokens} tokens; the route takes {list(DECODE_BLOCK_TOKENS)}"
    if kv_pages.stride()[1:] != (DS_MLA_BYTES, 1) or kv_pages.stride(0) % 16 or kv_pages.stride(0) < block_tokens * DS_MLA_BYTES:
        # FlashMLA steps from block to block by the cache's stride(0): a standalone cache, or one layer's
        # pages inside the packed pool (stride(0) = row bytes), checked against the reference on the H200
        # (scripts/h200/flashmla_views.py, 2026-12-01: o rel err 1.8e-3, no byte outside the view changed).
        return False, (f"page strides {tuple(kv_pages.stride())}: the route takes records of {DS_MLA_BYTES} bytes "
                       f"back to back in a block (strides (>= {block_tokens * DS_MLA_BYTES}, {DS_MLA_BYTES}, 1)) "
                       f"and blocks 16-byte aligned")
    ok = _common(q, kv_pages, slots)
    if not ok[0]:
        return ok
    if kv_pages.data_ptr() % 16:
        return False, "the pages start at an address not 16-byte aligned"
    if kv_pages.shape[0] == 0:  # (the op answers such calls itself: dsahal.ops._empty)
        return False, "pages of no block: FlashMLA's decode kernel reads past an empty cache (H100, 41st session)"
    return OK


def prefill_accepts(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale) -> tuple[bool, str]:
    """The bf16 sparse prefill kernel: one contiguous ``[tokens, 1, 576]`` bf16 latent array."""
    if kv_fmt != "bf16":
        return False, f"FlashMLA's sparse prefill reads bf16 latents, not {kv_fmt!r}"
    ok = _common(q, kv_pages, slots)  # one CTA per token over its whole slot list: batch-invariant as it is
    if not ok[0]:
        return ok
    blocks, block_tokens, record = kv_pages.shape
    if kv_pages.stride() != (block_tokens * record, record, 1):
        return False, (f"page strides {tuple(kv_pages.stride())}: FlashMLA's prefill reads one contiguous "
                       f"latent array (a standalone bf16 cache, not pages interleaved in a packed pool)")
    if kv_pages.data_ptr() % 16:
        return False, "the pages start at an address not 16-byte aligned"
    if kv_pages.shape[0] * kv_pages.shape[1] == 0:  # (the op answers such calls itself: dsahal.ops._empty)
        return False, "pages of no record: FlashMLA's kernels are not run on an empty cache"
    return OK


def _heads_padded(q: torch.Tensor) -> tuple[torch.Tensor, int]:
    """q ``[T, H, 576]`` -> ``[T, Hp, 576]`` with Hp the smallest FlashMLA head tile >= H (zero rows)."""
    heads = q.shape[1]
    tile = next(t for t in HEAD_TILES if t >= heads)
    if tile == heads and q.is_contiguous():
        return q, heads
    return torch.nn.functional.pad(q, (0, 0, 0, tile - heads)), heads  # zero heads appended


def _safe_indices(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """``[T, K]`` slots -> ``[T, Kp]`` int32, out-of-range entries -1, padded with -1 to Kp (one launch)."""
    from dsahal.backends.triton_kernels.index_guard import guard_indices

    width = -(-slots.shape[1] // TOPK_MULTIPLE) * TOPK_MULTIPLE
    return guard_indices(slots, num_slots, width)


_decode_meta: "OrderedDict[tuple, object]" = OrderedDict()
_DECODE_META_KEPT = 64  # shapes remembered (tokens per call vary: keep the recent ones, not every one seen)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _scheduler_metadata(key: tuple, device: torch.device):
    """FlashMLA fills an empty metadata object on its first call with a given shape; we keep one per
    shape. Inside a CUDA-graph capture a fresh one is used, so no cached tensor is born in the graph."""
    module = _module()
    if _capturing(device):
        return module.get_mla_metadata()[0]
    meta = _decode_meta.get(key)
    if meta is None:
        meta = _decode_meta[key] = module.get_mla_metadata()[0]
        if len(_decode_meta) > _DECODE_META_KEPT:
            _decode_meta.popitem(last=False)
    else:
        _decode_meta.move_to_end(key)
    return meta


TOPK_BLOCK = 64  # slots per step of the V32 decode kernel: a row of width W spans W / 64 blocks
_kernel_parts: dict[tuple, int] = {}
_whole_rows: "OrderedDict[tuple, object]" = OrderedDict()


def _kernel_part_count(module, device: torch.device, heads: int, width: int) -> int:
    """The V32 decode kernel's ``num_sm_parts`` (its grid) for ``heads`` (64 or 128) and a slot list of
    ``width``: the row count of FlashMLA's own schedule for a one-row batch (a shape, so no host sync).
    Outside a CUDA-graph capture the schedule's layout is checked once (one sync): the first part starts
    at row 0, block 0, and the parts end at the row's last block + 1 = ``width / TOPK_BLOCK``."""
    key = (device.index, heads, width)
    parts = _kernel_parts.get(key)
    if parts is None:
        rows = torch.full((1,), width, dtype=torch.int32, device=device)
        meta, _ = module.get_mla_decoding_metadata(rows, heads, 1, heads, True, width, use_legacy=True)
        parts = meta.shape[0]
        if _capturing(device):
            return parts
        table = meta.cpu()
        if (table.dim() != 2 or table.shape[1] != 8 or table[0, 0] != 0 or table[0, 2] != 0
                or int(table[:, 3].max()) != width // TOPK_BLOCK):
            raise RuntimeError(f"sparse_mla (flashmla_decode): FlashMLA {installed_version()}'s decode schedule has "
                               f"a layout this route does not know (expected [parts, 8] ending at block "
                               f"{width // TOPK_BLOCK}, got {tuple(table.shape)}: {table[:2].tolist()}...)")
        _kernel_parts[key] = parts
    return parts


def _whole_rows_schedule(module, tokens: int, heads: int, width: int, device: torch.device):
    """A ``FlashMLASchedMeta`` under which no row is split: part ``i`` of ``P`` takes rows
    ``[i·T/P, (i+1)·T/P)`` whole (``DecodingSchedMeta`` fields: begin row, end row (inclusive), begin block,
    end block (exclusive), begin split, first row split, last row split, pad); parts with no row start
    at row ``T`` (the kernel returns); ``num_splits`` is ``0..T`` (one split per row, so the combine pass
    leaves every row as the kernel wrote it). Built with device ops, so a CUDA-graph capture can build
    its own; outside a capture kept per shape."""
    parts = _kernel_part_count(module, device, heads, width)
    key = (device.index, tokens, heads, width)
    capturing = _capturing(device)
    meta = None if capturing else _whole_rows.get(key)
    if meta is None:
        bounds = torch.arange(parts + 1, device=device, dtype=torch.int64) * tokens // parts
        first, last = bounds[:-1], bounds[1:] - 1
        empty = last < first
        table = torch.zeros((parts, 8), dtype=torch.int32, device=device)
        table[:, 0] = torch.where(empty, tokens, first)
        table[:, 1] = torch.where(empty, tokens, last)
        table[:, 3] = width // TOPK_BLOCK
        meta = module.get_mla_metadata()[0]
        meta.tile_scheduler_metadata = table
        meta.num_splits = torch.arange(tokens + 1, device=device, dtype=torch.int32)
        if not capturing:
            _whole_rows[key] = meta
            if len(_whole_rows) > _DECODE_META_KEPT:
                _whole_rows.popitem(last=False)
    else:
        _whole_rows.move_to_end(key)
    return meta


def _finish(out: torch.Tensor, lse: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop padded heads; a row that saw no valid slot reports lse = -inf (the op's contract)."""
    if out.shape[1] != heads:
        out, lse = out[:, :heads].contiguous(), lse[:, :heads]
    # one pass: whatever FlashMLA reports for an empty row (+inf or NaN) becomes the contract's -inf; it also
    # makes the padded call's lse view a dense [T, H] tensor (an elementwise op's output is dense), so that view
    # needs no copy of its own (one launch fewer per padded call)
    return out, torch.nan_to_num(lse, nan=float("-inf"), posinf=float("-inf"))


def sparse_mla_decode(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """``sparse_mla`` on FlashMLA's sparse decode kernel. q ``[T, H, 576]`` bf16, kv_pages
    ``[blocks, 64, 656]`` uint8 (fp8_ds_mla), slots ``[T, K]``. Returns o ``[T, H, 512]`` bf16, lse ``[T, H]``."""
    module = _module()
    qp, heads = _heads_padded(q)
    indices = _safe_indices(slots, kv_pages.shape[0] * kv_pages.shape[1])
    tokens = q.shape[0]
    cache = kv_pages.unsqueeze(2)  # [blocks, block_tokens, 1, 656]: one KV head
    if config.batch_invariant():
        schedule = _whole_rows_schedule(module, tokens, qp.shape[1], indices.shape[1], q.device)
    else:
        schedule = _scheduler_metadata((q.device.index, tokens, qp.shape[1], kv_pages.shape[1], indices.shape[1]),
                                       q.device)
    out, lse = module.flash_mla_with_kvcache(
        qp.unsqueeze(1), cache, None, None, NOPE, schedule, softmax_scale=float(softmax_scale),
        is_fp8_kvcache=True, indices=indices.unsqueeze(1), use_legacy=True, kv_format="V32")
    # out [T, 1, Hp, 512], lse [T, Hp, 1]
    return _finish(out[:, 0], lse[:, :, 0], heads)


def sparse_mla_prefill(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """``sparse_mla`` on FlashMLA's sparse prefill kernel. q ``[T, H, 576]`` bf16, kv_pages
    ``[blocks, block_tokens, 1152]`` uint8 (bf16, contiguous), slots ``[T, K]``. Returns o, lse."""
    module = _module()
    qp, heads = _heads_padded(q)
    kv = kv_pages.view(torch.bfloat16).reshape(-1, 1, LATENT)
    indices = _safe_indices(slots, kv.shape[0])
    out, _, lse = module.flash_mla_sparse_fwd(qp, kv, indices.unsqueeze(1), float(softmax_scale), NOPE,
                                              use_legacy=True)
    return _finish(out, lse, heads)
