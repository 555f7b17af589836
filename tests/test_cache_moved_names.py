"""Names that moved from the contract to the planner (dsahal.cli.capacity) still resolve from their old places,
with a deprecation warning: the issue's rule is deprecate, don't break."""
import warnings

import pytest

import dsahal.cache as cache
from dsahal.cli import capacity as planner
from dsahal.config import load_config


def test_the_planner_names_resolve_from_dsahal_cache_with_a_warning():
    for name in ("Capacity", "Comparison", "PaddedLayout", "capacity", "compare", "padded_layouts",
                 "standard_comparisons"):
        with pytest.warns(DeprecationWarning, match=f"dsahal.cli.capacity.{name}"):
            assert getattr(cache, name) is getattr(planner, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        cache.no_such_name


def test_the_layouts_byte_accounting_answers_as_before_with_a_warning():
    layout = cache.plan_layout(load_config("tiny"), latent_fmt="nvfp4", index_fmt="mxfp4", block_tokens=64)
    report = planner.layout_report(layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the layout's own fields: no warning
        assert layout.row_bytes == report["row_bytes"]
    for name in ("row_padding_bytes", "payload_bytes_per_block", "recurrent_state_bytes", "conv_state_bytes",
                 "state_padding_bytes", "payload_bytes_per_token", "row_bytes_per_token"):
        with pytest.warns(DeprecationWarning, match="layout_report"):
            assert getattr(layout, name) == report[name]
    with pytest.warns(DeprecationWarning, match="layout_report"):
        assert layout.to_dict() == report
    with pytest.raises(AttributeError, match="no_such_field"):
        layout.no_such_field
