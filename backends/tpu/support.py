"""What the TPU backend claims, importable without torch_xla (the plugin and verifiers use it)."""
from __future__ import annotations

LATENT_FORMATS = frozenset({"bf16", "fp8", "fp8_ds_mla", "nvfp4"})
INDEX_FORMATS = frozenset({"bf16", "fp8", "mxfp4"})

UNVERIFIED_REASON = "run on XLA's CPU client (PJRT_DEVICE=CPU) only, never on a TPU"


def _format_ok(kind: str, fmt: str) -> tuple[bool, str]:
    claimed = LATENT_FORMATS if kind == "latent" else INDEX_FORMATS
    if fmt in claimed:
        return True, ""
    return False, f"{kind} format {fmt!r} has no XLA codec yet (claimed: {sorted(claimed)})"


def verify_cache_write(values, slots, pages, kind, fmt, scale):
    return _format_ok(kind, fmt)


def verify_indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context):
    return _format_ok("index", index_fmt)


def verify_sparse_mla(q, kv_pages, slots, kv_fmt, kv_scale, softmax_scale):
    return _format_ok("latent", kv_fmt)


def verify_dsa_attention(q_index, index_weights, index_pages, q, kv_pages, block_table, req_ids, positions, index_fmt,
                         kv_fmt, *rest):
    ok, reason = _format_ok("index", index_fmt)
    return (ok, reason) if not ok else _format_ok("latent", kv_fmt)
