"""The FlashMLA routes of the nvidia backend on the CPU: what their verifiers accept and why not, and the
marshalling around the kernel (head padding, the index guard, the lse layout and the empty-row fix-up)
against a plain-torch stand-in for FlashMLA's documented ABI. FlashMLA itself runs on the H200 only
(scripts/h200/routes_check.py); nothing here claims it ran."""
import os
import subprocess
import sys
import textwrap
import types

import torch

from dsahal.backends.nvidia import flashmla

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def meta_args(fmt="fp8_ds_mla", heads=16, block_tokens=64, dtype=torch.bfloat16):
    record = {"fp8_ds_mla": 656, "bf16": 1152, "fp8": 576}[fmt]
    q = torch.empty((5, heads, 576), dtype=dtype, device="meta")
    pages = torch.empty((8, block_tokens, record), dtype=torch.uint8, device="meta")
    slots = torch.empty((5, 128), dtype=torch.int32, device="meta")
    return q, pages, slots, fmt, None, 0.1


def test_the_decode_route_names_what_it_needs():
    ok, why = flashmla.decode_accepts(*meta_args("bf16"))
    assert not ok and "fp8_ds_mla (V32)" in why
    ok, why = flashmla.decode_accepts(*meta_args(dtype=torch.float32))
    assert not ok and "bf16 queries" in why
    ok, why = flashmla.decode_accepts(*meta_args(heads=192))
    assert not ok and "at most 128 heads" in why
    ok, why = flashmla.decode_accepts(*meta_args())
    assert not ok and "CUDA tensors" in why  # meta tensors stand in for CPU ones here


def test_the_prefill_route_needs_one_contiguous_bf16_latent_array():
    ok, why = flashmla.prefill_accepts(*meta_args("fp8_ds_mla"))
    assert not ok and "bf16 latents" in why


def test_the_probe_says_why_flashmla_is_off_here():
    ok, why = flashmla.probe()
    assert not ok and ("not installed" in why or "CUDA" in why)


MARSHALLING = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    import types
    import torch
    from dsahal.backends.nvidia import flashmla
    from dsahal.reference.cache import cache_write
    from dsahal.reference.sparse_mla import sparse_mla as reference

    calls = []

    def with_kvcache(q, k_cache, block_table, seqlens, head_dim_v, meta, softmax_scale, is_fp8_kvcache, indices,
                     use_legacy, kv_format):
        # FlashMLA's documented ABI: q [b, s_q, h_q, 576] with h_q 64 or 128, k_cache [blocks, 64, 1, 656],
        # indices [b, s_q, topk] int32 (only -1 invalid), out [b, s_q, h_q, 512], lse [b, h_q, s_q], +inf
        # for a row that saw no valid index
        assert q.shape[2] in (64, 128) and k_cache.shape[2] == 1 and indices.dtype == torch.int32
        assert kv_format == "V32" and use_legacy and is_fp8_kvcache
        assert int(indices.max()) < k_cache.shape[0] * k_cache.shape[1] and int(indices.min()) >= -1
        calls.append(indices.shape)
        b, s_q, h_q, _ = q.shape
        o, lse = reference(q.reshape(b * s_q, h_q, 576).float(), k_cache[:, :, 0], indices.reshape(b * s_q, -1),
                           "fp8_ds_mla", None, softmax_scale)
        lse = torch.where(torch.isinf(lse), float("inf"), lse)
        return o.reshape(b, s_q, h_q, 512).to(q.dtype), lse.reshape(b, s_q, h_q).transpose(1, 2)

    fake = types.SimpleNamespace(flash_mla_with_kvcache=with_kvcache, get_mla_metadata=lambda: (object(), None))
    flashmla._module = lambda: fake

    torch.manual_seed(0)
    pages = torch.zeros(4, 64, 656, dtype=torch.uint8)
    cache_write(torch.randn(256, 576), torch.arange(256), pages, "latent", "fp8_ds_mla", None)
    q = torch.randn(3, 12, 576)
    slots = torch.randint(0, 256, (3, 40))
    slots[0] = -1                # a row with no valid slot
    slots[1, 3] = 999            # out of range: must be skipped, never read
    slots[2, 5] = -4             # below -1: skipped as well
    o, lse = flashmla.sparse_mla_decode(q, pages, slots, "fp8_ds_mla", None, 0.07)
    clean = torch.where((slots >= 0) & (slots < 256), slots, -1)
    want_o, want_lse = reference(q, pages, clean, "fp8_ds_mla", None, 0.07)
    assert o.shape == (3, 12, 512) and lse.shape == (3, 12), (o.shape, lse.shape)
    assert o.is_contiguous() and lse.is_contiguous(), (o.stride(), lse.stride())  # the padded heads dropped
    torch.testing.assert_close(o, want_o, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)) and bool((lse[0] == float("-inf")).all())
    torch.testing.assert_close(lse[1:], want_lse[1:], rtol=1e-5, atol=1e-5)
    assert calls == [torch.Size([3, 1, 128])], calls  # padded to a multiple of 128 slots
    print("MARSHALLING OK")
""")


def test_decode_marshalling_pads_heads_guards_indices_and_reports_empty_rows_as_minus_inf():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    done = subprocess.run([sys.executable, "-c", MARSHALLING], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MARSHALLING OK" in done.stdout


def test_the_decode_route_takes_packed_pool_page_views_and_declines_interleaved_records():
    """Verified on the H200 (scripts/h200/flashmla_views.py): FlashMLA steps blocks by stride(0)."""
    pool = torch.empty((8, 2 * 64 * 656), dtype=torch.uint8, device="meta")
    pages = pool[:, :64 * 656].view(8, 64, 656)  # a layer's pages inside wider rows: stride(0) = row bytes
    q = torch.empty((5, 16, 576), dtype=torch.bfloat16, device="meta")
    slots = torch.empty((5, 128), dtype=torch.int32, device="meta")
    ok, why = flashmla.decode_accepts(q, pages, slots, "fp8_ds_mla", None, 0.1)
    assert not ok and "CUDA tensors" in why  # past the layout checks, stopped by the meta tensors only
    guarded = torch.empty((8, 64, 672), dtype=torch.uint8, device="meta")[:, :, 8:664]  # guard bytes per record
    ok, why = flashmla.decode_accepts(q, guarded, slots, "fp8_ds_mla", None, 0.1)
    assert not ok and "back to back" in why
    odd_rows = torch.empty((8, 64 * 656 + 8), dtype=torch.uint8, device="meta")[:, :64 * 656].view(8, 64, 656)
    ok, why = flashmla.decode_accepts(q, odd_rows, slots, "fp8_ds_mla", None, 0.1)
    assert not ok and "16-byte aligned" in why


def test_batch_invariant_mode_keeps_both_routes(monkeypatch):
    """Under DSAHAL_BATCH_INVARIANT=1 the prefill kernel serves as it is (one CTA per token and head block)
    and the decode kernel serves with a schedule of whole rows (below): neither declines for the mode."""
    from dsahal.backends.nvidia import config

    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    config.read_mode()
    try:
        ok, why = flashmla.decode_accepts(*meta_args())
        assert not ok and "CUDA tensors" in why  # past every mode and layout check, stopped by the meta tensors
        ok, why = flashmla.prefill_accepts(*meta_args("bf16"))
        assert not ok and "CUDA tensors" in why
    finally:
        monkeypatch.delenv("DSAHAL_BATCH_INVARIANT")
        config.read_mode()


class FakeScheduler:
    """FlashMLA's scheduler as documented in its DecodingSchedMeta (begin row, end row, begin block, end block,
    begin split, first split, last split, pad): one row of ``width`` slots cut over ``parts`` parts."""

    def __init__(self, parts, block=64, layout_ok=True):
        self.parts, self.block, self.layout_ok = parts, block, layout_ok

    def get_mla_decoding_metadata(self, rows, heads, h_k, h_q, is_fp8, width, use_legacy):
        assert use_legacy and is_fp8 and h_k == 1 and heads == h_q and rows.shape == (1,)
        blocks = width // self.block
        table = torch.zeros((self.parts, 8), dtype=torch.int32)
        cuts = torch.linspace(0, blocks, self.parts + 1).round().int()
        table[:, 2], table[:, 3] = cuts[:-1], cuts[1:]
        if not self.layout_ok:
            table = table[:, :6]
        return table, torch.tensor([0, self.parts], dtype=torch.int32)

    def get_mla_metadata(self):
        return types.SimpleNamespace(), None


def test_the_invariant_decode_schedule_gives_every_row_whole_to_one_part():
    flashmla._kernel_parts.clear()
    flashmla._whole_rows.clear()
    fake = FakeScheduler(parts=4)
    for tokens in (1, 2, 4, 10, 13):
        meta = flashmla._whole_rows_schedule(fake, tokens, 128, 2048, torch.device("cpu"))
        table = meta.tile_scheduler_metadata
        assert table.shape == (4, 8) and table.dtype == torch.int32
        owner = []
        for begin, end, first_block, last_block, split, first_split, last_split, _ in table.tolist():
            assert (first_block, last_block, split, first_split, last_split) == (0, 2048 // 64, 0, 0, 0)
            if begin >= tokens:  # a part with no row: the kernel returns at once
                continue
            owner.extend(range(begin, end + 1))
        assert owner == list(range(tokens)), (tokens, table)  # each row once, whole, in order
        assert meta.num_splits.tolist() == list(range(tokens + 1))  # one split per row: combine skips them all
    assert flashmla._whole_rows_schedule(fake, 10, 128, 2048, torch.device("cpu")) is \
        flashmla._whole_rows_schedule(fake, 10, 128, 2048, torch.device("cpu"))  # kept per shape


def test_an_unknown_flashmla_schedule_layout_is_an_error_not_a_guess():
    flashmla._kernel_parts.clear()
    flashmla._whole_rows.clear()
    for fake in (FakeScheduler(parts=4, layout_ok=False), FakeScheduler(parts=4, block=32)):
        try:
            flashmla._whole_rows_schedule(fake, 8, 64, 256, torch.device("cpu"))
        except RuntimeError as exc:
            assert "flashmla_decode" in str(exc) and "layout" in str(exc)
        else:
            raise AssertionError("a schedule of another layout was accepted")


def test_neither_route_takes_pages_of_no_record(monkeypatch):
    """FlashMLA's decode kernel read past an empty cache (compute-sanitizer, H100, forty-first session): both routes
    decline pages of no block (the ops answer such calls themselves before any route: dsahal.ops._empty)."""
    monkeypatch.setattr(flashmla, "_common", lambda *args: (True, ""))  # past the device checks (meta tensors here)
    q, pages, slots, fmt, scale, softmax_scale = meta_args()
    assert flashmla.decode_accepts(q, pages, slots, fmt, scale, softmax_scale) == (True, "")
    empty = torch.empty((0, 64, 656), dtype=torch.uint8, device="meta")
    ok, why = flashmla.decode_accepts(q, empty, slots, fmt, scale, softmax_scale)
    assert not ok and "empty cache" in why
    empty_bf16 = torch.empty((0, 64, 1152), dtype=torch.uint8, device="meta")
    ok, why = flashmla.prefill_accepts(q, empty_bf16, slots, "bf16", None, softmax_scale)
    assert not ok and "empty cache" in why
