"""Triton kernels shared by the GPU backends (NVIDIA today; AMD and PPU can reuse them).

One module per op family, each in the Triton-tutorial shape: the ``@triton.jit`` kernel, then a
launcher that takes the op's tensors plus explicit block sizes (a backend picks them for its
hardware), then a ``_check()`` that compares the launcher with the reference on random inputs.

- :mod:`.bytes`         reinterpreting uint8 cache pages as bf16 / fp8 / fp32 inside a kernel
- :mod:`.indexer`       paged lightning-indexer score over bf16 or FP8 (132 B) index keys
- :mod:`.topk`          exact top-k by three-level radix select, smaller index wins ties
- :mod:`.sparse_mla`    sparse MLA over paged latents (bf16, fp8, fp8_ds_mla), split-K capable
- :mod:`.lse_combine`   merge partial attention outputs by their log-sum-exp
- :mod:`.slots`         request positions to physical cache slots
- :mod:`.cache_write`   quantise and scatter tokens into cache pages
- :mod:`.kda`           KDA recurrent step over a pooled state (decode, and per-token prefill)
- :mod:`.kda_chunk`     KDA chunked prefill (chunks of 16: a token-parallel and a head-parallel pass)
- :mod:`.limits`        what the kernels accept: the verifiers every backend routing to them uses

Importing a kernel module imports triton (:mod:`.limits` does not); nothing here imports a vendor library. Every kernel masks
out-of-range indices (slots, blocks, state ids) so any index value is memory-safe.
"""
