"""What the shared Triton kernels accept: one verifier per op, ``(*op_args) -> (ok, reason)``.

Every backend that routes to these kernels (nvidia, amd, ppu) uses these verifiers, adding only its
own device or architecture conditions through ``device_check`` (default :func:`on_gpu`). They read
metadata only (never tensor values: no GPU sync). ROCm and PPU tensors report device type ``"cuda"``,
like NVIDIA ones.
"""
from __future__ import annotations

import torch

# Plain data, no triton import: a backend's verifiers must load where triton is absent.
CACHE_WRITE_FORMATS = frozenset({("latent", "bf16"), ("latent", "fp8"), ("latent", "fp8_ds_mla"), ("latent", "nvfp4"),
                                 ("index", "bf16"), ("index", "fp8"), ("index", "mxfp4")})
LATENT_FORMATS = frozenset({"bf16", "fp8", "fp8_ds_mla", "nvfp4"})
INDEX_FORMATS = frozenset({"bf16", "fp8", "mxfp4"})
MAX_INDEX_HEADS = 128
MAX_SMALL_MLA_HEADS = 64  # the few-heads kernels' MAX_HEADS: their fp32 accumulator is 512 x heads (64 need 8 warps)
SMALL_MLA_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_KDA_KEY_DIM = 256
# The dtypes the KDA kernels read. The op also takes a float64 gate (its docs: any float dtype, used in fp32):
# the launchers hand the kernels it as fp32 (kda_gate: one elementwise pass a call), so the kernels never load
# fp64 and such a call is not left to the float64 reference (as it was before the forty-first session).
KDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KDA_GATE_DTYPES = KDA_DTYPES + (torch.float64,)
OK = (True, "")


def on_gpu(**tensors) -> tuple[bool, str]:
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and not tensor.is_cuda:  # (is_cuda: 60 ns; device.type: 280)
            return False, f"'{name}' is on {tensor.device}; the Triton kernels need GPU (cuda) tensors"
    return OK


def unit_stride(**tensors) -> tuple[bool, str]:
    """The kernels step through the last dim of these tensors one element at a time."""
    for name, tensor in tensors.items():
        if tensor.dim() and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
            return False, f"'{name}' has stride {tensor.stride(-1)} in its last dim; the Triton kernel needs 1"
    return OK


def _all(*checks) -> tuple[bool, str]:
    """The first failing check, else OK; checks are thunks so later ones run only when needed."""
    for check in checks:
        ok, why = check()
        if not ok:
            return ok, why
    return OK


def cache_write(values, slots, pages, kind, fmt, scale, *, device_check=on_gpu):
    if (kind, fmt) not in CACHE_WRITE_FORMATS:
        return False, f"no Triton cache-write kernel for format {kind}:{fmt}"
    return device_check(values=values, slots=slots, pages=pages)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context, *,
                  device_check=on_gpu):
    if index_fmt not in INDEX_FORMATS:
        return False, f"the Triton indexer reads {sorted(INDEX_FORMATS)} keys, not {index_fmt!r}"
    if q.shape[1] > MAX_INDEX_HEADS:
        return False, f"the Triton indexer holds at most {MAX_INDEX_HEADS} heads, got {q.shape[1]}"
    # (any strides: the launcher copies a q or weights whose last dim is strided, a few KB to a few MB, where the
    # reference fallback would cost a float64 pass over every key; block tables arrive with unit stride from the
    # public ops, dsahal.ops._layout)
    return device_check(q=q, weights=weights, index_pages=index_pages, block_table=block_table)


def topk(scores, lengths, k, *, device_check=on_gpu):
    return device_check(scores=scores, lengths=lengths)


def positions_to_slots(positions, req_ids, block_table, block_tokens, *, device_check=on_gpu):
    # (the public ops hand this route unit-stride metadata: dsahal.ops._layout)
    return device_check(positions=positions, req_ids=req_ids, block_table=block_table)


def sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, device_check=on_gpu):
    if kv_fmt not in LATENT_FORMATS:
        return False, f"Triton sparse MLA reads {sorted(LATENT_FORMATS)} latents, not {kv_fmt!r}"
    return device_check(q=q, kv_pages=kv_pages, slots=slots)


def sparse_mla_small_heads(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale, *, device_check=on_gpu):
    """The few-heads kernel (:mod:`.sparse_mla_small_heads`): every head of a token in one program."""
    if kv_fmt not in LATENT_FORMATS:
        return False, f"Triton small-head sparse MLA reads {sorted(LATENT_FORMATS)} latents, not {kv_fmt!r}"
    if q.dim() != 3 or q.shape[1] > MAX_SMALL_MLA_HEADS:
        return False, (f"Triton small-head sparse MLA holds at most {MAX_SMALL_MLA_HEADS} heads in one program, "
                       f"got q of shape {list(q.shape)}")
    if q.dtype not in SMALL_MLA_Q_DTYPES:
        return False, f"Triton small-head sparse MLA reads bf16/fp16/fp32 queries, not {q.dtype}"
    return device_check(q=q, kv_pages=kv_pages, slots=slots)


def lse_combine(o_parts, lse_parts, *, device_check=on_gpu):
    return device_check(o_parts=o_parts, lse_parts=lse_parts)


def _kda(q, k, v, g, beta, state_pool, device_check):
    if q.shape[-1] > MAX_KDA_KEY_DIM:
        return False, f"Triton KDA key dim {q.shape[-1]} > {MAX_KDA_KEY_DIM}"
    for name, tensor in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        if tensor.dtype not in KDA_DTYPES:
            return False, f"Triton KDA reads fp32/bf16/fp16 '{name}', not {str(tensor.dtype).replace('torch.', '')}"
    if g.dtype not in KDA_GATE_DTYPES:
        return False, f"Triton KDA reads an fp64/fp32/bf16/fp16 'g', not {str(g.dtype).replace('torch.', '')}"
    return _all(lambda: unit_stride(q=q, k=k, v=v, g=g, state_pool=state_pool),
                lambda: device_check(q=q, k=k, v=v, g=g, state_pool=state_pool))


def kda_gate(g: torch.Tensor) -> torch.Tensor:
    """The gate ``g`` as a KDA launcher hands it to its kernel: used in fp32 (the op's contract), so an fp64 gate
    becomes fp32 here (the kernels are compiled and tested for 16- and 32-bit loads only); any other as given."""
    return g.float() if g.dtype == torch.float64 else g


def kda_decode(q, k, v, g, beta, state_pool, state_ids, scale, use_qk_l2norm, *, device_check=on_gpu):
    return _kda(q, k, v, g, beta, state_pool, device_check)


def kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, *,
                device_check=on_gpu):
    return _kda(q, k, v, g, beta, state_pool, device_check)
