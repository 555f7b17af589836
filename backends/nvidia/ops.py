"""The NVIDIA backend's op implementations: the shared Triton kernels with this backend's block
sizes. Each takes its op's arguments in the order of the op's spec (:data:`dsahal.ops.catalog.SPECS`)."""
from __future__ import annotations

import functools

import torch

from dsahal.backends.triton_kernels import cache_write as _cache_write
from dsahal.backends.triton_kernels import indexer as _indexer
from dsahal.backends.triton_kernels import kda as _kda
from dsahal.backends.triton_kernels import kda_chunk as _kda_chunk
from dsahal.backends.triton_kernels import lse_combine as _lse
from dsahal.backends.triton_kernels import slots as _slots
from dsahal.backends.triton_kernels import sparse_mla as _mla
from dsahal.backends.triton_kernels import sparse_mla_small_heads as _mla_small
from dsahal.backends.triton_kernels import topk as _topk

from dsahal.ops.score_ranges import requests_in_range, slots_over_score_ranges, tokens_per_range

from . import config


def cache_write(values, slots, pages, kind, fmt, scale):
    _cache_write.cache_write(values, slots, pages, kind, fmt, scale)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    return _indexer.indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context,
                                  **config.indexer_config(q.shape[1], q.dtype, index_fmt))


def topk(scores, lengths, k):
    return _topk.topk(scores, lengths, k, **config.topk_config(scores.shape[1]))


def positions_to_slots(positions, req_ids, block_table, block_tokens):
    return _slots.positions_to_slots(positions, req_ids, block_table, block_tokens)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    cfg = config.sparse_mla_config(q.shape[0], q.shape[1], slots.shape[1], kv_fmt, q.dtype)
    return _mla.sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **cfg)


def sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """Every head of a token in one program: each gathered latent row is read once (the few-heads route)."""
    cfg = _small_heads_config(q.shape[1], kv_fmt, q.dtype)
    return _mla_small.sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **cfg)


_small_heads_config = functools.lru_cache(maxsize=64)(_mla_small.hopper_config)


def sparse_mla_gluon(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """The Gluon few-heads kernel (fp8_ds_mla, <= 16 heads): gathers staged by cp.async, one warp per tile part."""
    from dsahal.backends.triton_kernels.sparse_mla_gluon import sparse_mla_gluon as launch  # (imports Gluon)

    return launch(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **config.GLUON_FEW_HEADS)


def sparse_mla_wgmma(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """The wgmma few-heads kernel (fp8_ds_mla or per-tensor FP8 records, 16 heads a program, sm_90): the gathered
    slots as the logit wgmma's M side; :func:`wgmma_launch` its launch parameters."""
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import producer_refusal  # (imports Gluon)
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma as launch

    options = wgmma_launch(q.shape[0], q.device, kv_fmt)
    if options.get("ws") and producer_refusal():  # a Triton that cannot compile the producer: the launch without it
        options = dict(options, ws=False)  # (the same results bit for bit, 1-10% slower; docs/nvidia.md)
    return launch(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **options)


def sparse_mla_wgmma_fp4(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    """The wgmma NVFP4 kernel (nvfp4 latents, 16 heads a program, sm_90): the codes decoded exactly into fp16 MMA operands,
    the gathered slots the logit wgmma's M side; :func:`wgmma_fp4_launch` its launch."""
    from dsahal.backends.triton_kernels.sparse_mla_wgmma_fp4 import sparse_mla_wgmma_fp4 as launch  # (imports Gluon)

    return launch(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, **wgmma_fp4_launch(q.shape[0], q.device))


def wgmma_fp4_launch(tokens: int, device=None) -> dict:
    """The wgmma NVFP4 kernel's launch parameters for a call of ``tokens`` query tokens on ``device``:
    ``config.WGMMA_NVFP4`` (fixed splits: batch invariant); in default mode the balanced schedule from
    ``config.WGMMA_BALANCED_FROM_TOKENS["nvfp4"]`` tokens (``device`` None: never), else ``config.WGMMA_NVFP4_MANY``'s
    three programs a SM from its token count and ``config.WGMMA_NVFP4_SMALL_SPLITS``' smaller splits below theirs."""
    if config.batch_invariant():
        return config.WGMMA_NVFP4
    balanced = _balanced(config.WGMMA_NVFP4, tokens, device, "nvfp4")
    if balanced is not None:
        return balanced
    many = config.WGMMA_NVFP4_MANY
    if tokens >= many["from_tokens"]:
        return dict(config.WGMMA_NVFP4, stages=many["stages"], maxnreg=many["maxnreg"], in_flight=many["in_flight"])
    for below, split_size in config.WGMMA_NVFP4_SMALL_SPLITS:
        if tokens < below:
            return dict(config.WGMMA_NVFP4, split_size=split_size)
    return config.WGMMA_NVFP4


def wgmma_launch(tokens: int, device=None, kv_fmt: str = "fp8_ds_mla") -> dict:
    """The wgmma few-heads kernel's launch parameters for a call of ``tokens`` query tokens of ``kv_fmt`` records on
    ``device``: ``config.WGMMA_FEW_HEADS`` (fixed splits: batch invariant); in default mode the balanced schedule from
    ``config.WGMMA_BALANCED_FROM_TOKENS[kv_fmt]`` tokens (``device`` None: never), else ``config.WGMMA_SMALL_SPLITS``'
    smaller splits (more programs) below their token counts."""
    if config.batch_invariant():
        return config.WGMMA_FEW_HEADS
    balanced = _balanced(config.WGMMA_FEW_HEADS, tokens, device, kv_fmt)
    if balanced is not None:
        return balanced
    for below, split_size in config.WGMMA_SMALL_SPLITS:
        if tokens < below:
            return dict(config.WGMMA_FEW_HEADS, split_size=split_size)
    return config.WGMMA_FEW_HEADS


def _balanced(launch: dict, tokens: int, device, kv_fmt: str) -> dict | None:
    """``launch`` on the balanced schedule (``config.WGMMA_PROGRAMS_PER_SM`` programs a SM of ``device``) where default
    mode takes it for ``tokens`` query tokens of ``kv_fmt`` records (``config.WGMMA_BALANCED_FROM_TOKENS``); else
    None."""
    start = config.WGMMA_BALANCED_FROM_TOKENS.get(kv_fmt)
    if device is None or start is None or tokens < start:
        return None
    return dict(launch, programs=config.WGMMA_PROGRAMS_PER_SM * _multiprocessors(device))


@functools.lru_cache(maxsize=None)
def _multiprocessors(device) -> int:
    """``device``'s streaming multiprocessors (asked once a device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def lse_combine(o_parts, lse_parts):
    return _lse.lse_combine(o_parts, lse_parts)


lse_combine.prepare_bare_launch = _lse.prepare_bare_launch  # the dispatch bench's kernel-launch floor


def dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                  kv_fmt, kv_scale, topk, max_context, softmax_scale):
    """Indexer -> top-k with the slot translation fused into its output write -> sparse MLA on the best
    route the table has for these arguments (FlashMLA where it serves them), so the layer is never slower
    than its sparse-MLA stage run alone. The first two run over token ranges whose scores fit
    :data:`dsahal.ops.score_ranges.SCORES_BUDGET_BYTES` (one range for a decode batch), in one reused buffer."""
    # score rows of a multiple of 16 floats: the top-k's launchers then never copy them to align them (.alignment)
    padded = -(-max_context // 16) * 16
    tokens = q_index.shape[0]
    # one score buffer, reused by each token range (dsahal.ops.score_ranges: one range up to 1024 tokens at 128K)
    buffer = torch.empty((min(tokens, tokens_per_range(padded)), padded), dtype=torch.float32, device=q_index.device)
    indexer_options = config.indexer_config(q_index.shape[1], q_index.dtype, index_fmt)
    topk_options = config.topk_config(max_context)
    maxima = _group_maxima_buffer(buffer.shape[0], max_context, topk, topk_options, index_fmt, q_index,
                                  -(-tokens // max(1, block_table.shape[0])))

    def slots_of(rows: slice) -> torch.Tensor:
        count = rows.stop - rows.start
        # (planned as the whole call: a range's tokens a request are the call's, not its share of the table's rows)
        scores = _indexer.indexer_score(q_index[rows], index_weights[rows], index_pages, block_table, req_ids[rows],
                                        positions[rows], index_fmt, max_context, out=buffer[:count, :max_context],
                                        requests=requests_in_range(block_table.shape[0], count, tokens),
                                        **indexer_options,
                                        **({} if maxima is None else dict(group_maxima=maxima[0][:count],
                                                                          maxima_group=maxima[1])))
        filled = False
        if maxima is not None:  # (the indexer then says whether its kernel filled them: the Gluon kernel only)
            scores, filled = scores
        lengths = torch.clamp(positions[rows].to(torch.int32) + 1, max=max_context)
        return _topk.topk(scores, lengths, topk, emit_slots=(req_ids[rows], block_table, index_pages.shape[1]),
                          group_maxima=maxima[0][:count] if filled else None, **topk_options)

    slots = slots_over_score_ranges(tokens, padded, slots_of)
    from dsahal import ops  # (the public op: its table picks the route and observers see the stage)

    return ops.sparse_mla(q, kv_pages, slots, kv_fmt=kv_fmt, kv_scale=kv_scale, softmax_scale=softmax_scale,
                          check=False)


def _group_maxima_buffer(rows: int, max_context: int, k: int, topk_options: dict, index_fmt: str, q_index,
                         per_request: int):
    """The fused indexer -> top-k (:func:`.config.fused_group_maxima`, the groups method's rows): ``(maxima, G)``, the
    DSA layer's ``[rows, columns]`` int32 buffer of the top-k's group maxima (groups of ``G`` scores) for its ranges,
    the columns past the rows' groups zero (the indexer writes only those its scores cover;
    :func:`~dsahal.backends.triton_kernels.topk_groups.maxima_layout`); None where the layer runs the stages apart.
    ``per_request``: the call's query tokens a request, as the indexer counts them (the block table's rows)."""
    if topk_options.get("method") != "groups" or not config.fused_group_maxima(index_fmt, q_index.dtype, per_request):
        return None
    from dsahal.backends.triton_kernels.topk_groups import MAXIMA_GROUPS, maxima_layout

    size, columns = maxima_layout(max_context, k, **topk_options)
    if size not in MAXIMA_GROUPS:
        return None
    maxima = torch.empty((rows, columns), dtype=torch.int32, device=q_index.device)
    maxima[:, -(-max_context // size):].zero_()
    return maxima, size


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm):
    return _kda.kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm,
                           **config.kda_decode_config(v.shape[-1]))


def kda_prefill_chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """Our chunked kernel (chunks of 16, two passes: :mod:`~dsahal.backends.triton_kernels.kda_chunk`) in its
    ``tf32`` mode (fp32 pair products, tf32 MMAs, fp32 scratch) for 16-bit inputs, exact fp32 dots for fp32
    ones (bf16 operands throughout fail the suite's bound on small rows; fp16 ones overflow on strong decays)."""
    return _chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, "tf32")


def kda_prefill_chunked_mixed(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """The chunked kernel's ``mixed`` mode for 16-bit inputs (fp32 pair products and ``qg``, bf16 elsewhere:
    half the scratch bytes of ``tf32``), exact fp32 dots for fp32 inputs."""
    return _chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, "mixed")


def _chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, mode):
    # (V past 128: the launcher runs slices of at most 128 value columns, each launched as a V <= 128 call)
    options = (dict(operands="fp32") if q.dtype == torch.float32
               else config.kda_chunk_config(min(v.shape[-1], 128), mode))
    return _kda_chunk.kda_prefill_chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm,
                                          **options)


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """The exact recurrent kernel, token by token: the route for the calls neither the short nor the chunked kernel
    takes (fp32 inputs; K past 128); fla's ``chunk_kda`` (:mod:`.kda_fla`) only when forced."""
    return _kda.kda_prefill_recurrent(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm,
                                      **config.kda_prefill_config(v.shape[-1]))
