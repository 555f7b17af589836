"""The validation fast paths (issue 16 item 4) accept exactly what the full checks accept, and the errors
they defer keep their messages: where a named size came from is recomputed only when a check fails."""
import itertools
import sys

import pytest
import torch

from dsahal.ops._validate import FLOAT_DTYPES, ShapeBinder

lse_module = sys.modules["dsahal.ops.lse_combine"]


def _full_checks(o_parts, lse_parts):
    """lse_combine's checks through the generic binder only (no one-expression fast path)."""
    v = ShapeBinder("lse_combine")
    v.tensor("o_parts", o_parts, ("W", "T", "H", None), FLOAT_DTYPES)
    v.tensor("lse_parts", lse_parts, ("W", "T", "H"), torch.float32)
    v.same_device(o_parts=o_parts, lse_parts=lse_parts)


def _outcome(fn, *args):
    try:
        fn(*args)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


O_CASES = [torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4, 8, dtype=torch.bfloat16), torch.zeros(2, 3, 4, 8, dtype=torch.float64),
           torch.zeros(2, 3, 4), torch.zeros(1, 3, 4, 8), torch.zeros(2, 3, 4, 8, device="meta"),
           torch.nn.Parameter(torch.zeros(2, 3, 4, 8)), None, [1.0]]
LSE_CASES = [torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.float16), torch.zeros(2, 3, 5), torch.zeros(2, 3),
             torch.zeros(2, 3, 4, device="meta"), torch.zeros(2, 3, 4, 1), 3]


@pytest.mark.parametrize("o_parts, lse_parts", list(itertools.product(O_CASES, LSE_CASES)))
def test_lse_combine_fast_path_accepts_and_rejects_what_the_full_checks_do(o_parts, lse_parts):
    assert _outcome(lse_module.validate_lse_combine, o_parts, lse_parts) == _outcome(_full_checks, o_parts, lse_parts)


def test_a_size_bound_by_an_earlier_argument_is_named_in_the_error():
    v = ShapeBinder("op")
    v.tensor("a", torch.zeros(2, 3), ("T", "H"))
    with pytest.raises(ValueError, match=r"^dsahal\.op: argument 'b' expected shape \[T, \*\] \(T=2 from 'a' dim 0\), "
                                         r"got shape \[5, 1\] \(dim 0 is 5\)$"):
        v.tensor("b", torch.zeros(5, 1), ("T", None))


def test_a_size_bound_earlier_in_the_same_argument_is_named_in_the_error():
    v = ShapeBinder("op")
    v.tensor("a", torch.zeros(2), ("T",))
    with pytest.raises(ValueError, match=r"\(D=3 from 'b' dim 1\), got shape \[2, 3, 4\] \(dim 2 is 4\)$"):
        v.tensor("b", torch.zeros(2, 3, 4), ("T", "D", "D"))


def test_a_given_size_is_named_given():
    v = ShapeBinder("op", B=4)
    with pytest.raises(ValueError, match=r"\(B=4 from given\), got shape \[3\] \(dim 0 is 3\)$"):
        v.tensor("x", torch.zeros(3), ("B",))


def test_an_optional_none_binds_nothing_and_a_failed_argument_does_not_count_as_a_source():
    v = ShapeBinder("op")
    v.tensor("skip", None, ("T",), optional=True)
    with pytest.raises(ValueError, match="expected device meta"):
        v.tensor("a", torch.zeros(2), ("T",), device=torch.device("meta"))
    with pytest.raises(ValueError, match=r"\(T=2 from 'b' dim 0\)"):
        v.tensor("b", torch.zeros(2, 3), ("T", "T"))


def test_device_stride_dtype_and_type_errors_keep_their_messages():
    v = ShapeBinder("op")
    with pytest.raises(ValueError, match=r"argument 'x' expected unit stride in its last dim, got strides \[1, 2\]$"):
        v.tensor("x", torch.zeros(3, 2).t(), (None, None), last_dim_contiguous=True)
    v.tensor("y", torch.zeros(3, 2).t(), (None, None))  # (no stride check asked for: accepted)
    with pytest.raises(TypeError, match=r"argument 'x' expected dtype int32 or int64, got float32$"):
        v.tensor("x", torch.zeros(2), (None,), (torch.int32, torch.int64))
    with pytest.raises(TypeError, match=r"argument 'x' expected dtype float16, got float32$"):
        v.tensor("x", torch.zeros(2), (None,), torch.float16)
    with pytest.raises(TypeError, match=r"argument 'x' expected a tensor, got None$"):
        v.tensor("x", None, (None,))
    with pytest.raises(TypeError, match=r"argument 'x' expected a torch.Tensor, got list$"):
        v.tensor("x", [1], (None,))
    with pytest.raises(ValueError, match=r"argument 'x' expected a 2-d tensor of shape \[\*, 4\], got shape \[4\]$"):
        v.tensor("x", torch.zeros(4), (None, 4))
