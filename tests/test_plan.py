"""The planner against hand-computed figures, and the ``dsahal plan`` command."""
import json

import pytest

from dsahal.cache import plan_layout
from dsahal.cli.capacity import capacity, padded_layouts, payload_bytes_per_token, standard_comparisons
from dsahal.cli import main
from dsahal.cli.plan import build_plan, parse_tokens
from dsahal.config import load_config

K31 = load_config("k31-pro")
GIB_48 = 48 * 2**30
KDA_STATE_TP8 = 69 * (12 * 128 * 128 * 4 + 3 * 3 * 12 * 128 * 4)  # 69 KDA layers x (12 heads/device x 128x128 fp32
# recurrent + 3 x 3 x 1,536 fp32 short-conv) = 58,079,232 B


def test_k31_fp8_tp8_pow2_rows_by_hand():
    layout = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8", block_tokens=64, tp=8, row_rounding="pow2")
    # 24 DSA layers x 64 tokens x (576 + 132) B; both page sizes are multiples of 256, so no alignment gaps
    assert layout.row_data_bytes == 24 * 64 * (576 + 132) == 1_087_488
    assert layout.row_bytes == 2**21
    assert [p.offset for p in layout.pages[:4]] == [0, 36_864, 45_312, 82_176]
    assert layout.state_bytes == KDA_STATE_TP8 and layout.rows_per_state == 28  # ceil(58,079,232 / 2 MiB)
    cap = capacity(layout, GIB_48, 1_000_000)
    assert payload_bytes_per_token(layout) == cap.payload_bytes_per_token == 16_992
    assert cap.rows == 24_576 and cap.tokens == 24_576 * 64
    assert cap.blocks_per_context == 15_625 and cap.full_contexts == 24_576 // (15_625 + 28) == 1


def test_rows_are_rounded_to_whole_pages_by_default_not_to_a_power_of_two():
    layout = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8", block_tokens=64, tp=8)
    assert layout.row_rounding == "page"
    assert layout.row_bytes == layout.row_data_bytes == 1_087_488  # 4248 pages of 256 B: no padding at all
    assert layout.rows_per_state == 54  # ceil(58,079,232 / 1,087,488)
    cap = capacity(layout, GIB_48, 1_000_000)
    assert cap.rows == 47_393 and cap.tokens == 47_393 * 64  # 3.03M: the seed's 3.04M, not pow2's 1.57M


def test_k31_nvfp4_mxfp4_tp8_dcp8_page_rows_by_hand():
    layout = plan_layout(K31, latent_fmt="nvfp4", index_fmt="mxfp4", block_tokens=64, tp=8, dcp=8,
                         row_rounding="page")
    assert layout.row_bytes == layout.row_data_bytes == 24 * 64 * (352 + 68) == 645_120
    assert layout.rows_per_state == 91  # ceil(58,079,232 / 645,120)
    cap = capacity(layout, GIB_48, 1_000_000)
    assert payload_bytes_per_token(layout) == cap.payload_bytes_per_token == 24 * (352 + 68) / 8 == 1260
    assert cap.rows == 79_891  # floor(48 GiB / 645,120)
    assert cap.tokens == 79_891 * 64 * 8 and cap.tokens_per_device == 79_891 * 64
    assert cap.blocks_per_context == 1_954  # ceil(1M / 8 / 64): each rank holds 125,000 tokens
    assert cap.full_contexts == 79_891 // (1_954 + 91) == 39


def test_unaligned_pages_start_on_256_byte_boundaries_by_hand():
    layout = plan_layout(load_config("tiny"), latent_fmt="bf16", index_fmt="fp8", block_tokens=3)
    latent, index = layout.pages
    assert (latent.offset, latent.nbytes) == (0, 3 * 1152)
    assert (index.offset, index.nbytes) == (3584, 3 * 132)  # 3456 rounded up to a multiple of 256
    assert layout.row_data_bytes == 3980 and layout.row_bytes == 4096
    # tiny: 3 KDA layers x (4 heads x 128 x 128 fp32 recurrent + 3 x 3 x 512 fp32 short-conv after it)
    assert [s.offset for s in layout.states] == [0, 280_576, 561_152]
    assert [s.offset for s in layout.conv_states] == [262_144, 542_720, 823_296]
    assert layout.state_bytes == 841_728 and layout.rows_per_state == 206


def test_tp_shards_kda_state_but_not_the_token_pages():
    tp1 = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8")
    tp8 = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8", tp=8)
    assert tp1.row_data_bytes == tp8.row_data_bytes  # latent and index keys are replicated under TP
    assert tp1.state_bytes == 8 * tp8.state_bytes


def test_fp4_formats_against_fp8_match_the_bytes_per_token_ratio():
    layout = plan_layout(K31, latent_fmt="nvfp4", index_fmt="mxfp4", tp=8, row_rounding="page")
    (versus_fp8,) = standard_comparisons(K31, layout, GIB_48, 1_000_000)
    assert versus_fp8.payload_ratio == pytest.approx((576 + 132) / (352 + 68))  # 1.686
    assert versus_fp8.tokens_ratio == pytest.approx(708 / 420, rel=1e-4)  # page rows: whole rows only
    assert plan_layout(K31, latent_fmt="nvfp4", index_fmt="mxfp4", tp=8) == layout  # page rows are the default
    pow2 = plan_layout(K31, latent_fmt="nvfp4", index_fmt="mxfp4", tp=8, row_rounding="pow2")
    (pow2_versus_fp8,) = standard_comparisons(K31, pow2, GIB_48, 1_000_000)
    assert pow2_versus_fp8.tokens_ratio == 2.0  # 1 MiB rows against 2 MiB rows


def test_dcp8_holds_eight_times_the_tokens_of_tp8():
    layout = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8", tp=8, dcp=8)
    (versus_tp8,) = standard_comparisons(K31, layout, GIB_48, 1_000_000)
    assert versus_tp8.baseline == "fp8+fp8 TP8" and versus_tp8.tokens_ratio == 8.0
    # per device a 1M context needs 15,625 block rows under TP8 but 1,954 under DCP8; the 54-row KDA state
    # is not sharded by DCP, so contexts grow by less than 8x before rounding down (47,393 page rows)
    assert versus_tp8.contexts == (47_393 // (15_625 + 54), 47_393 // (1_954 + 54)) == (3, 23)


def test_per_layer_padding_wastes_what_the_packed_row_saves_by_hand():
    layout = plan_layout(K31, latent_fmt="fp8", index_fmt="fp8", tp=8, row_rounding="page")
    widest, uniform = padded_layouts(layout, GIB_48, 1_000_000)
    assert widest.page_bytes == 64 * 576 and widest.bytes_per_block == 48 * 64 * 576
    assert widest.waste_fraction == pytest.approx(1 - 1_087_488 / 1_769_472)  # 38.5%
    assert uniform.page_bytes == 12 * 128 * 128 * 4 + 3 * 3 * 12 * 128 * 4  # one KDA layer's state is the largest
    assert uniform.tokens < widest.tokens < capacity(layout, GIB_48, 1_000_000).tokens


@pytest.mark.parametrize("text,expected", [("1000000", 10**6), ("128k", 128_000), ("1M", 10**6), ("1Mi", 2**20),
                                           ("2.5k", 2500)])
def test_context_lengths_accept_decimal_and_binary_suffixes(text, expected):
    assert parse_tokens(text) == expected


def test_plan_command_prints_layout_capacity_and_comparisons(capsys):
    code = main(["plan", "--config", "k31-pro", "--latent-fmt", "nvfp4", "--index-fmt", "mxfp4", "--tp", "8",
                 "--dcp", "8", "--block-tokens", "64", "--memory-gib", "48", "--context", "1M",
                 "--row-rounding", "page", "--verbose"])
    out = capsys.readouterr().out
    assert code == 0
    assert "row: 645,120 B of pages + 0 B padding = 645,120 B" in out
    assert "58,079,232 B -> 91 rows" in out
    assert "bytes per token per device: 1260.0 payload" in out
    assert "tokens that fit: 40,904,192" in out and "full 1,000,000-token contexts: 39" in out
    assert "vs fp8+fp8 TP8 DCP8: 1.69x tokens" in out and "vs nvfp4+mxfp4 TP8: 8.00x tokens" in out
    # --verbose folds the 24 DSA layers' page pairs into one row with a count
    page_rows = [line.split() for line in out.splitlines() if line.endswith(" x i") and "latent" in line]
    assert [row[-9:-5] for row in page_rows] == [["24", "latent", "nvfp4", "22,528"]]


def test_plan_command_json_is_the_same_plan(capsys):
    args = ["--latent-fmt", "fp8_ds_mla", "--index-fmt", "fp8", "--tp", "4", "--memory-gib", "10", "--context", "128k"]
    assert main(["plan", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(build_plan("k31-pro", "fp8_ds_mla", "fp8", 4, 1, 64, 10.0, 128_000)))
    assert data["layout"]["latent_token_bytes"] == 656
    assert data["capacity"]["rows"] == 10 * 2**30 // data["layout"]["row_bytes"]  # page rows by default


def test_plan_command_reports_bad_arguments_without_a_traceback(capsys):
    assert main(["plan", "--tp", "5", "--memory-gib", "8", "--context", "1M"]) == 2
    assert "argument '--tp' expected a divisor of the kda heads (96), got 5" in capsys.readouterr().err
    assert main(["plan", "--memory-gib", "8", "--context", "lots"]) == 2
    assert "expected a token count" in capsys.readouterr().err
