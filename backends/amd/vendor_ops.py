"""The AITER and FlyDSL paths: marshal dsahal's arguments (:mod:`.marshal`), call the vendor kernel,
bring the result back to dsahal's contract. None of these has run on ROCm hardware.

The vendor entry points are looked up by path name in :data:`KERNELS` and imported on first use
(``amd-aiter`` cannot even be imported without ROCm). The CPU tests put a plain-torch emulation of
each kernel's documented ABI in :data:`KERNELS` to check the marshalling around it; that checks
our side of the call, never the kernel.

Signatures are the backend-facing argument lists of :mod:`dsahal.ops`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from . import marshal
from .arch import arch_facts, gfx_of
from .paths import PATHS_BY_NAME

# path name -> vendor callable or "module:attr" (see paths.FAST_PATHS for the list).
KERNELS: dict[str, Any] = {name: path.api for name, path in PATHS_BY_NAME.items()}
_lock = threading.Lock()


def kernel(path: str) -> Callable[..., Any]:
    """The vendor entry point of ``path``, imported on first use."""
    target = KERNELS[path]
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    with _lock:
        import importlib

        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        KERNELS[path] = obj
    return obj


def _fp8_dtype(tensor: torch.Tensor) -> torch.dtype:
    facts = arch_facts(gfx_of(tensor))
    return facts.fp8_dtype if facts else torch.float8_e4m3fn


# -- indexer ----------------------------------------------------------------------------------------

def indexer_score_fp8(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """AITER ``deepgemm_fp8_paged_mqa_logits`` on the 132 B fp8 index keys, one token per request."""
    fp8_dtype = _fp8_dtype(q)
    kv_cache = marshal.fp8_index_pages_to_deepgemm(index_pages, fnuz=fp8_dtype == torch.float8_e4m3fnuz)
    q_fp8, weights = marshal.quantize_index_queries_fp8(q, weights, fp8_dtype)
    context_lens, tables = marshal.per_token_requests(block_table, req_ids, positions)
    logits = torch.empty((q.shape[0], max_context), dtype=torch.float32, device=q.device)
    if q.shape[0]:
        kernel("aiter.indexer_fp8")(q_fp8, kv_cache, weights, logits, context_lens, tables, max_context,
                                    KVBlockSize=index_pages.shape[1])
    return marshal.mask_invisible_logits(logits, block_table, req_ids, positions, index_pages.shape[1])


def indexer_score_mxfp4(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    """FlyDSL ``flydsl_pa_mqa_logits_fp4`` (gfx950): e2m1 x e2m1 MFMA with E8M0 block scales, fp32
    accumulation, the weighted ReLU reduction over heads fused; q is quantised to MXFP4 here."""
    kv_cache, kv_scale = marshal.mxfp4_index_pages_to_preshuffled(index_pages)
    if q.dtype == torch.float8_e4m3fn:
        q = q.float()
    q_packed, q_scale, _ = marshal.quantize_index_queries_mxfp4(q)
    context_lens, tables = marshal.per_token_requests(block_table, req_ids, positions)
    block_tokens = index_pages.shape[1]
    # The kernel reads whole 256-key chunks: widen the table so the tail chunk stays in bounds.
    chunk = 256
    need_blocks = -(-max(max_context, 1) // chunk) * (chunk // block_tokens)
    if tables.shape[1] < need_blocks:
        tables = torch.nn.functional.pad(tables, (0, need_blocks - tables.shape[1])).contiguous()
    logits = torch.full((q.shape[0], max_context), float("-inf"), dtype=torch.float32, device=q.device)
    if q.shape[0]:
        # The kernel loads weights as bf16 (then widens to fp32): a relative 2^-9 rounding per head.
        kernel("flydsl.indexer_mxfp4")(q_packed, q_scale, kv_cache, kv_scale, tables, weights.to(torch.bfloat16).contiguous(),
                                       context_lens, max_context, next_n=1, block_k=chunk,
                                       kv_block_size=block_tokens, out=logits)
    return marshal.mask_invisible_logits(logits, block_table, req_ids, positions, block_tokens)


# -- top-k ------------------------------------------------------------------------------------------

def topk(scores, lengths, k):
    """AITER ``top_k_per_row_prefill`` over ``[0, lengths[t])`` with its stable (smaller index wins)
    tie-break; -inf entries and anything past the length become -1, valid ones first."""
    tokens, width = scores.shape
    indices = torch.full((tokens, k), -1, dtype=torch.int32, device=scores.device)
    if tokens and width:
        scores = scores.contiguous()
        row_starts = torch.zeros(tokens, dtype=torch.int32, device=scores.device)
        kernel("aiter.topk")(scores, row_starts, lengths.to(torch.int32).contiguous(), indices, None, tokens,
                             scores.stride(0), scores.stride(1), k=k, stable=True)
    return clean_topk_indices(indices, scores, lengths)


def clean_topk_indices(indices, scores, lengths):
    """dsahal's top-k contract from a kernel's raw ``[T, k]`` indices, whatever it wrote in the
    slots it had nothing for: only in-range, finite, first occurrences stay; -1 elsewhere; valid
    ones first (their order kept)."""
    tokens, width = scores.shape
    long_indices = indices.long()
    in_row = (long_indices >= 0) & (long_indices < lengths.long()[:, None])
    safe = long_indices.clamp(0, max(width - 1, 0))
    picked = scores.gather(1, safe) if width else torch.full(indices.shape, float("-inf"), device=scores.device)
    keep = in_row & (picked > float("-inf"))
    # A repeated index (padding written as a valid-looking id) counts once.
    by_index = torch.sort(torch.where(keep, long_indices, width), dim=1, stable=True)
    repeated = torch.zeros_like(keep)
    repeated[:, 1:] = (by_index.values[:, 1:] == by_index.values[:, :-1]) & (by_index.values[:, 1:] < width)
    keep &= ~torch.zeros_like(keep).scatter(1, by_index.indices, repeated)
    cleaned = torch.where(keep, indices, torch.full_like(indices, -1))
    valid_first = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    return cleaned.gather(1, valid_first)


# -- sparse MLA -------------------------------------------------------------------------------------

def sparse_mla_aiter(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """AITER ``mla_decode_fwd`` with page size 1: each query token is one request whose KV list is its
    valid slots (the layout vLLM's ROCM_AITER_MLA_SPARSE backend feeds it). bf16 q and latent."""
    tokens, heads, _ = q.shape
    kv_buffer = marshal.latent_rows(kv_pages, torch.bfloat16)
    qo_indptr, kv_indptr, kv_indices, last_page_lens = marshal.slots_to_ragged(slots)
    o = torch.empty((tokens, heads, 512), dtype=q.dtype, device=q.device)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32, device=q.device)
    if tokens and kv_indices.numel():
        o, lse = kernel("aiter.sparse_mla")(q.contiguous(), kv_buffer, o, qo_indptr, kv_indptr, kv_indices,
                                            last_page_lens, 1, page_size=1, nhead_kv=1,
                                            sm_scale=float(softmax_scale), return_lse=True)
    return marshal.empty_rows_to_zero(o, lse.reshape(tokens, heads), slots)


def sparse_mla_flydsl(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """AITER's FlyDSL ``flydsl_sparse_mla_decode`` (gfx950, 16 heads, fp8 q and fp8 latent).

    q is quantised per tensor; its scale and the cache's per-tensor scale fold into the softmax
    scale, and the cache scale multiplies the output (the kernel reads unit-scale fp8). The kernel
    returns no lse: it is rebuilt from the per-split base-2 partials we hand it as workspace.
    """
    tokens, heads, _ = q.shape
    q_fp8, q_scale = marshal.quantize_q_fp8_per_tensor(q)
    rows = marshal.latent_rows(kv_pages, torch.float8_e4m3fn).reshape(-1, 576)
    indices = marshal.pad_slots_to_tiles(slots)
    groups = _flydsl_partial_groups(tokens, indices.shape[1] // marshal.FLYDSL_TILE)
    partial_o = torch.empty((tokens, groups, heads, 512), dtype=torch.bfloat16, device=q.device)
    partial_lse = torch.empty((tokens, groups, heads), dtype=torch.float32, device=q.device)
    out = torch.empty((tokens, heads, 512), dtype=torch.bfloat16, device=q.device)
    tensor_scale = kv_scale.float()
    effective_scale = float(softmax_scale) * float(q_scale) * float(tensor_scale)
    kernel("flydsl.sparse_mla")(q_fp8, rows, indices, out, effective_scale,
                                partial_output=partial_o, partial_lse=partial_lse)
    o = (out.float() * tensor_scale).to(q.dtype)
    lse = marshal.lse_from_log2_partials(partial_lse)
    return marshal.empty_rows_to_zero(o, lse, slots)


def _flydsl_partial_groups(tokens: int, splits: int) -> int:
    """Partial rows the FlyDSL launcher expects: it groups up to 4 key tiles per producer while the
    grid keeps >= 192 (pairs) or >= 384 (quads) producers (AITER's ``_pick_inner_iter``)."""
    inner = 1
    while inner < 4 and splits % (inner * 2) == 0:
        floor = 192 if inner * 2 == 2 else 384
        if tokens * (splits // (inner * 2)) < floor:
            break
        inner *= 2
    return splits // inner


# -- collectives ------------------------------------------------------------------------------------

_communicators: dict[Any, Any] = {}


def all_gather(x, group):
    """AITER's custom all-gather (peer buffers over HIP IPC, written straight into the output) when
    it accepts the tensor; RCCL through torch.distributed otherwise. Returns ``[W, *x.shape]``."""
    import torch.distributed as dist

    from dsahal.ops.collectives import group_rank_and_size

    _, world = group_rank_and_size(group)
    if world == 1:
        return x.unsqueeze(0).clone()
    communicator = _communicator(group, x.device)
    flat = x.contiguous().reshape(1, -1)
    if communicator is not None and communicator.should_custom_ag(flat):
        return communicator.custom_all_gather(flat, dim=0).reshape(world, *x.shape)
    out = x.new_empty((world, *x.shape))
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _communicator(group, device):
    """One AITER ``CustomAllreduce`` per group, attached to a gloo twin of the group (AITER exchanges
    its IPC handles over a non-NCCL group). Created collectively on first use; None if AITER
    disables itself (e.g. ranks on different nodes)."""
    import torch.distributed as dist

    key = (id(group), str(device))
    if key not in _communicators:
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        gloo_twin = dist.new_group(ranks, backend="gloo")
        communicator = kernel("aiter.all_gather")(gloo_twin, device)
        _communicators[key] = None if communicator.disabled else communicator
    return _communicators[key]
