"""`dsahal plan`'s output: the answer first, details behind --verbose with repeated rows folded, and
--help with defaults and without reStructuredText markup."""
import pytest

from dsahal.cli import build_parser, main, plain_text
from dsahal.cli.plan import build_plan, fold_runs, layer_list

K31_1M = ["plan", "--config", "k31-pro", "--tp", "8", "--memory-gib", "48", "--context", "1M"]


def test_the_answer_comes_first_and_the_default_output_is_short(capsys):
    assert main(K31_1M) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  tokens that fit: 3,033,152 across the group")  # 47,393 page rows x 64
    assert lines[2].startswith("  full 1,000,000-token contexts: 3 ")
    assert len(lines) <= 14 and "--verbose" in lines[-1]
    assert not any(" latent " in line and "36,864" in line for line in lines)  # no page rows by default


def test_verbose_folds_the_24_page_pairs_and_the_69_kda_states_into_one_row_each(capsys):
    assert main(K31_1M + ["--verbose"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].startswith("  tokens that fit:")  # still the answer first
    page_rows = [line for line in lines if line.endswith("+ 45,312 x i")]  # 45,312 B: one layer's two pages
    assert len(page_rows) == 2
    assert page_rows[0].split()[-9:-5] == ["24", "latent", "fp8", "36,864"]
    assert page_rows[0].endswith("0 + 45,312 x i") and page_rows[1].endswith("36,864 + 45,312 x i")
    state_rows = [line for line in lines if line.rstrip().endswith("+ 841,728 x i")]  # recurrent + conv per layer
    assert len(state_rows) == 2 and all(" 69 " in row for row in state_rows)
    assert state_rows[0].split()[-7:-5] == ["recurrent", "786,432"] and state_rows[0].endswith(" 0 + 841,728 x i")
    assert state_rows[1].split()[-7:-5] == ["short-conv", "55,296"] and state_rows[1].endswith("786,432 + 841,728 x i")
    assert "uniform-page" in out and "widest-token-page" in out
    assert len(lines) < 40


def test_fold_runs_keeps_a_row_apart_when_size_or_step_changes():
    states = [{"layer": 0, "offset": 0, "nbytes": 10}, {"layer": 1, "offset": 10, "nbytes": 10},
              {"layer": 2, "offset": 20, "nbytes": 10}, {"layer": 4, "offset": 40, "nbytes": 10},  # step 20
              {"layer": 5, "offset": 50, "nbytes": 12}]  # another size
    runs = fold_runs(states)
    assert [(r["layers"], r["step"]) for r in runs] == [([0, 1, 2], 10), ([4], 0), ([5], 0)]


def test_fold_runs_folds_the_real_layout_to_what_the_layout_holds():
    plan = build_plan("k31-pro", "nvfp4", "mxfp4", 8, 8, 64, 48, 1_000_000)
    pages, states = plan["layout"]["pages"], plan["layout"]["states"]
    (page_run,) = fold_runs(pages)
    assert len(page_run["layers"]) == 24 and len(page_run["first"]) == 2
    # unfolding gives back every page: layer i's pages at first + i * step
    unfolded = [dict(p, layer=layer, offset=p["offset"] + i * page_run["step"])
                for i, layer in enumerate(page_run["layers"]) for p in page_run["first"]]
    assert unfolded == list(pages)
    (state_run,) = fold_runs(states)
    assert len(state_run["layers"]) == 69 and state_run["step"] == states[1]["offset"] - states[0]["offset"]


@pytest.mark.parametrize("layers, text", [
    ([0, 1, 2, 4, 5, 6, 8], "0-2, 4-6, 8"),
    ([3, 7, 11, 15], "3, 7, ..., 15 (every 4)"),
    ([5], "5"),
    (list(range(0, 20, 3)) + [20, 21], "0, 3, 6, ..., 20-21"),
])
def test_layer_lists_are_ranges_or_a_progression(layers, text):
    assert layer_list(layers) == text


def test_plan_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: k31-pro)", "(default: fp8)", "(default: 1)", "(default: 64)", "(default: page)"):
        assert default in out, default
    assert "--memory-gib" in out and "(required)" in out


def test_no_help_text_shows_restructuredtext_markup():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "plan" in a.choices)
    texts = [parser.format_help()] + [p.format_help() for p in sub.choices.values()]
    for text in texts:
        assert "``" not in text and ":mod:`" not in text and ":func:`" not in text and ":class:`" not in text


def test_plain_text_turns_literals_and_roles_into_words():
    assert plain_text("``--check`` and :mod:`dsahal.bench.quick`") == "--check and dsahal.bench.quick"
    assert plain_text(":func:`~dsahal.cache.capacity`, :ref:`the guide <guide>`") == "capacity, the guide"
