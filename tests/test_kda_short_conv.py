"""KDA's short convolution (issue 21, item 2): the causal depthwise conv + SiLU on q, k, v against a float64
reference written here, its per-request state in the packed pool (chunked prefill = whole prefill, prefill then
decode = whole prefill, padding rows write nothing), and the layout that counts it."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from dsahal.cache import PAGE_ALIGN, PackedKVCache, conv_state_offset, plan_layout
from dsahal.cli.capacity import capacity, layout_report
from dsahal.config import load_config
from dsahal.model import BatchMeta
from dsahal.model.kda_layer import KdaStates, conv_state_view
from dsahal.model.short_conv import conv_decode, conv_prefill, write_states
from test_model_helpers import small_config, small_model

P, C, W = 3, 8, 4  # q, k, v; channels; kernel


def reference(x, weight, init=None):
    """float64 ``silu(conv1d)`` of one sequence x ``[L, P, C]`` after ``init`` ``[P, W - 1, C]`` (zeros if None),
    with F.conv1d (depthwise, no padding over the state-extended input). Returns (out ``[L, P, C]``, new state)."""
    x, weight = x.double(), weight.double()
    init = torch.zeros(P, W - 1, C, dtype=torch.float64) if init is None else init.double()
    extended = torch.cat([init.permute(1, 0, 2), x])  # [W - 1 + L, P, C]
    if len(x) == 0:  # (conv1d refuses an input shorter than the kernel)
        return torch.zeros(0, P, C, dtype=torch.float64), init
    signal = extended.permute(1, 2, 0).reshape(1, P * C, -1)
    out = F.conv1d(signal, weight.reshape(P * C, 1, W), groups=P * C)  # [1, P*C, L]
    out = F.silu(out).reshape(P, C, -1).permute(2, 0, 1)
    return out, extended[-(W - 1):].permute(1, 0, 2)


def inputs(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, P, C, generator=gen) for n in lengths]
    return xs, torch.randn(P, C, W, generator=gen)


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_prefill_of_packed_sequences_matches_the_float64_reference():
    lengths = [7, 1, 2, 0, 5]  # shorter than the kernel, empty, longer
    xs, weight = inputs(lengths)
    pool = torch.zeros(6, P, W - 1, C)
    ids = torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32)
    out = conv_prefill(torch.cat(xs), weight, cu(lengths), pool, ids)
    for b, x in enumerate(xs):
        want, state = reference(x, weight)
        got = out[cu(lengths)[b]:cu(lengths)[b + 1]]
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pool[ids[b]].double(), state, rtol=0, atol=0)  # the last W - 1 raw inputs
    assert bool((pool[3] == 0).all())  # no sequence had state 3


@pytest.mark.parametrize("splits", [[1] * 13, [3, 10], [5, 4, 4], [13]])
def test_prefill_in_chunks_equals_prefill_of_the_whole_sequence(splits):
    (x,), weight = inputs([13], seed=1)
    want, state = reference(x, weight)
    pool = torch.zeros(2, P, W - 1, C)
    ids = torch.tensor([1], dtype=torch.int32)
    parts, start = [], 0
    for n in splits:
        parts.append(conv_prefill(x[start:start + n], weight, cu([n]), pool, ids))
        start += n
    whole = conv_prefill(x, weight, cu([13]), torch.zeros(2, P, W - 1, C), ids)
    # Same taps in the same order; only SiLU's vectorised and scalar paths may differ in the last bit.
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(whole.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pool[1].double(), state, rtol=0, atol=0)


def test_prefill_then_decode_equals_prefill_of_the_whole_sequence_for_a_batch():
    lengths, extra = [6, 2, 9], 5
    xs, weight = inputs([n + extra for n in lengths], seed=2)
    pool = torch.zeros(4, P, W - 1, C)
    ids = torch.tensor([2, 0, 3], dtype=torch.int32)
    prompt = conv_prefill(torch.cat([x[:n] for x, n in zip(xs, lengths)]), weight, cu(lengths), pool, ids)
    steps = [conv_decode(torch.stack([x[n + t] for x, n in zip(xs, lengths)]), weight, pool, ids)
             for t in range(extra)]
    for b, (x, n) in enumerate(zip(xs, lengths)):
        want, state = reference(x, weight)
        got = torch.cat([prompt[cu(lengths)[b]:cu(lengths)[b + 1]], torch.stack([s[b] for s in steps])])
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pool[ids[b]].double(), state, rtol=0, atol=0)


def test_padding_rows_read_zeros_and_write_nothing():
    (x,), weight = inputs([4], seed=3)
    pool = torch.randn(3, P, W - 1, C)
    pool[0] = float("nan")  # a padding row must not read it (nor turn it into its output)
    before = pool.clone()
    # decode: padding rows around a real request whose state is slot 0's neighbour
    ids = torch.tensor([-1, 2, -1], dtype=torch.int32)
    out = conv_decode(x[:3], weight, pool, ids)
    want_pad0, _ = reference(x[0:1], weight)
    torch.testing.assert_close(out[0].double(), want_pad0[0], rtol=1e-5, atol=1e-6)  # from a zero state
    want_real, state = reference(x[1:2], weight, init=before[2])
    torch.testing.assert_close(out[1].double(), want_real[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(pool[2].double(), state)
    assert torch.equal(pool[1], before[1]) and torch.isnan(pool[0]).all()
    # every row padding (the CUDA-graph warm-up): the pool is unchanged, bit for bit
    snapshot = pool.clone()
    conv_decode(x[:2], weight, pool, torch.tensor([-1, -1], dtype=torch.int32))
    assert torch.equal(pool.view(torch.int32), snapshot.view(torch.int32))
    # prefill: a padding sequence starts from zeros and writes nowhere
    conv_prefill(x, weight, cu([2, 2]), pool, torch.tensor([-1, 1], dtype=torch.int32))
    assert torch.equal(pool[0].view(torch.int32), snapshot[0].view(torch.int32))
    assert torch.equal(pool[2], snapshot[2]) and not torch.equal(pool[1], snapshot[1])


def test_a_padding_row_beside_the_request_of_state_zero_does_not_clobber_its_write():
    (x,), weight = inputs([3], seed=4)
    pool = torch.zeros(2, P, W - 1, C)
    values = torch.randn(3, P, W - 1, C)
    write_states(pool, torch.tensor([-1, 0, -1], dtype=torch.int32), values)
    assert torch.equal(pool[0], values[1]) and bool((pool[1] == 0).all())


# --- the pool: layout, views, the KDA layer ---------------------------------------------------------


def test_the_layout_counts_a_conv_state_beside_every_kda_layers_recurrent_state():
    config = load_config("k31-pro")
    layout = plan_layout(config, latent_fmt="nvfp4", index_fmt="mxfp4", tp=8)
    heads, dim = config.kda_num_heads // 8, config.kda_head_dim
    conv = 3 * (4 - 1) * heads * dim * 4
    assert layout.kda_conv_kernel == 4 and layout.kda_layer_conv_bytes == conv
    assert [s.layer for s in layout.conv_states] == config.kda_layers
    for state, conv_spec in zip(layout.states, layout.conv_states):
        assert conv_spec.offset == conv_state_offset(state.offset, state.nbytes) and conv_spec.nbytes == conv
        assert conv_spec.offset % PAGE_ALIGN == 0
    spans = sorted((s.offset, s.offset + s.nbytes) for s in layout.states + layout.conv_states)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # no two overlap
    report = layout_report(layout)
    assert layout.state_bytes == spans[-1][1] >= report["recurrent_state_bytes"] + report["conv_state_bytes"]
    assert report["conv_state_bytes"] == len(config.kda_layers) * conv
    without = 69 * 12 * 128 * 128 * 4  # the recurrent states alone
    assert layout.rows_per_state == -(-layout.state_bytes // layout.row_bytes) > -(-without // layout.row_bytes)
    cap = capacity(layout, 48 << 30, 1_000_000)
    assert cap.state_bytes_per_context == layout.rows_per_state * layout.row_bytes
    assert dataclasses.replace(config, name="k").kda_layers  # (the preset has KDA layers)


def test_the_layers_conv_view_is_the_pools_conv_states_and_a_standalone_pool_is_refused():
    config = small_config()
    layout = plan_layout(config, block_tokens=16)
    cache = PackedKVCache(layout, num_rows=3 * layout.rows_per_state + 1)
    for layer in config.kda_layers:
        mine, pools = conv_state_view(cache.kda_states(layer), 4), cache.kda_conv_states(layer)
        assert mine.shape == pools.shape and mine.stride() == pools.stride()
        assert mine.storage_offset() == pools.storage_offset()
        assert mine.data_ptr() == pools.data_ptr()
    standalone = torch.zeros(2, config.kda_num_heads, config.kda_head_dim, config.kda_head_dim)
    with pytest.raises(ValueError, match="argument 'state_pool' expected a KDA state view of a packed cache pool"):
        conv_state_view(standalone, 4)


def one_request(length, *, start=0, state_id=0, decode=False):
    return BatchMeta(torch.arange(start, start + length, dtype=torch.int32), torch.zeros(length, dtype=torch.int32),
                     torch.zeros(1, 1, dtype=torch.int32), torch.full((length,), -1, dtype=torch.int64),
                     torch.tensor([0, length], dtype=torch.int32), torch.tensor([state_id], dtype=torch.int32),
                     16, decode)


@pytest.fixture(scope="module")
def layer_and_config():
    config = small_config()
    model = small_model(config, seed=5)
    return next(b.attn for b in model.blocks if b.kind == "kda"), config


@torch.no_grad()
def test_the_layer_runs_q_k_v_through_the_reference_conv(layer_and_config):
    layer, config = layer_and_config
    x = torch.randn(9, config.hidden_size, generator=torch.Generator().manual_seed(6))
    states = KdaStates.zeros(2, layer.heads, layer.head_dim, layer.conv_kernel)
    qkv = torch.stack([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=1)
    got = layer.short_conv(qkv, one_request(9, state_id=1), states.conv)
    weight = torch.stack([layer.q_conv1d.weight, layer.k_conv1d.weight, layer.v_conv1d.weight])
    channels = layer.heads * layer.head_dim
    extended = torch.cat([torch.zeros(3, 3, channels, dtype=torch.float64), qkv.double().permute(1, 0, 2)], dim=1)
    want = F.silu(F.conv1d(extended.permute(0, 2, 1).reshape(1, 3 * channels, -1), weight.double().reshape(3 * channels, 1, 4),
                           groups=3 * channels)).reshape(3, channels, -1).permute(2, 0, 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert bool((states.conv[0] == 0).all()) and bool((states.conv[1] != 0).any())


@torch.no_grad()
def test_layer_chunked_prefill_and_decode_over_the_packed_pool_equal_the_whole_prefill(layer_and_config):
    layer, config = layer_and_config
    layout = plan_layout(config, block_tokens=16)
    kda = config.kda_layers[0]
    x = torch.randn(23, config.hidden_size, generator=torch.Generator().manual_seed(7))

    def run(pieces):
        cache = PackedKVCache(layout, num_rows=2 * layout.rows_per_state)
        state = cache.allocate_state()
        outs, start = [], 0
        for n, decode in pieces:
            outs.append(layer(x[start:start + n], one_request(n, start=start, state_id=state, decode=decode),
                              cache.kda_states(kda)))
            start += n
        return torch.cat(outs), cache.kda_states(kda)[state], cache.kda_conv_states(kda)[state]

    whole, recurrent, conv = run([(23, False)])
    for pieces in ([(2, False), (9, False), (12, False)], [(17, False)] + [(1, True)] * 6):
        out, rec, cv = run(pieces)
        torch.testing.assert_close(out, whole, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rec, recurrent, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cv, conv, rtol=1e-5, atol=1e-6)  # raw projections of the last 3 tokens
    assert bool((conv != 0).any())


def test_dsahal_plan_counts_and_prints_the_conv_state(capsys):
    from dsahal.cli import main

    args = ["plan", "--config", "k31-pro", "--latent-fmt", "nvfp4", "--index-fmt", "mxfp4", "--tp", "8", "--dcp", "8",
            "--memory-gib", "48", "--context", "1M"]
    assert main(args + ["--verbose"]) == 0
    out = capsys.readouterr().out
    # 69 x (786,432 recurrent + 55,296 conv) B; 54,263,808 B alone took 85 rows of 645,120 B
    assert "58,079,232 B -> 91 rows (recurrent 54,263,808 B + short-conv 3,815,424 B)" in out
    assert "(each 1,954 block rows + 91 KDA-state rows per device)" in out
    conv_rows = [line.split() for line in out.splitlines() if " short-conv " in line and line.endswith(" x i")]
    assert [row[-8:] for row in conv_rows] == [["69", "short-conv", "55,296", "786,432", "+", "841,728", "x", "i"]]
    assert main(args + ["--json"]) == 0
    import json

    layout = json.loads(capsys.readouterr().out)["layout"]
    assert layout["conv_state_bytes"] == 3_815_424 and len(layout["conv_states"]) == 69
