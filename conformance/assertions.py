"""Property checks with rich failure messages.

Every check takes the test's :class:`~dsahal.conformance.harness.PropertyRun`; on a violation it
calls ``run.fail(detail)``, which names the property and appends the drawn case and a
reproduction snippet. Float comparisons are normwise relative errors per row (a row = one output
vector, e.g. one ``[token, head]``), never a bare absolute tolerance.
"""
from __future__ import annotations

import torch

# Normwise relative tolerance of an op's output by the dtype it computes/returns in. A kernel may
# accumulate in fp32 from bf16 inputs, round P to bf16 for the PV product, use TF32 for fp32.
RTOL_BY_DTYPE = {torch.float32: 2.0**-10, torch.float16: 2.0**-8, torch.bfloat16: 2.0**-6,
                 torch.float8_e4m3fn: 2.0**-6, torch.float64: 1e-9}


def output_rtol(*dtypes: torch.dtype) -> float:
    """The loosest tolerance among the dtypes an op reads or writes."""
    return max(RTOL_BY_DTYPE.get(d, 2.0**-6) for d in dtypes)


def _where(index: tuple) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def assert_shape_dtype(run, name: str, got, shape, dtypes, device=None) -> None:
    """``got`` is a tensor of ``shape`` and one of ``dtypes``, on ``device`` (default: the run's device, where
    the property placed the op's inputs; the distributed properties' gloo ranks compute on the CPU)."""
    if not isinstance(got, torch.Tensor):
        run.fail(f"'{name}' expected a tensor, got {type(got).__name__}")
    # the inputs live on the run's device, so must the output: checked here, before a comparison copies it to
    # the CPU (a meta tensor would fail there as "Cannot copy out of meta tensor", naming no output)
    device = device if device is not None else getattr(run, "device", None)
    if device is not None and got.device.type != device.type:
        run.fail(f"'{name}' expected on the inputs' device {device.type!r}, got a tensor on {str(got.device)!r}")
    allowed = (dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes)
    if list(got.shape) != list(shape) or got.dtype not in allowed:
        run.fail(f"'{name}' expected shape {list(shape)} dtype {[str(d) for d in allowed]}, "
                 f"got shape {list(got.shape)} dtype {got.dtype}")


def _cpu(*tensors: torch.Tensor):
    """Comparisons run on the CPU whatever device produced the tensors."""
    return tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in tensors)


def assert_no_nan(run, name: str, got: torch.Tensor) -> None:
    (got,) = _cpu(got)
    bad = torch.isnan(got.float())
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        run.fail(f"'{name}' has NaN at {_where(where)} ({int(bad.sum())} NaN entries)")


def assert_same_neg_inf(run, name: str, got: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """-inf exactly where the reference has -inf (masks are exact, not approximate)."""
    got, expected = _cpu(got, expected)
    got_inf, exp_inf = got == float("-inf"), expected == float("-inf")
    if torch.equal(got_inf, exp_inf):
        return
    index = tuple(int(i) for i in (got_inf != exp_inf).nonzero()[0])
    state = "-inf" if bool(got_inf[index]) else f"finite ({float(got[index]):.6g})"
    want = "-inf" if bool(exp_inf[index]) else f"finite ({float(expected[index]):.6g})"
    run.fail(f"'{name}'{what} mask differs from the reference at {_where(index)}: got {state}, expected {want} "
             f"({int((got_inf != exp_inf).sum())} entries differ)")


def assert_rows_close(run, name: str, got: torch.Tensor, expected: torch.Tensor, rtol: float,
                      row_dims: int = 1) -> None:
    """Per row (the last ``row_dims`` dims form one vector): ``|got - expected| <= rtol * (|expected|
    + 1e-3 * max row norm)``. Entries that are -inf in both are ignored; NaN always fails."""
    got, expected = _cpu(got, expected)
    assert_no_nan(run, name, got)
    if got.shape != expected.shape:
        run.fail(f"'{name}' expected shape {list(expected.shape)}, got {list(got.shape)}")
    if got.numel() == 0:
        return
    got64, exp64 = got.double(), expected.double()
    both_inf = torch.isinf(got64) & torch.isinf(exp64) & (torch.sign(got64) == torch.sign(exp64))
    got64, exp64 = torch.where(both_inf, 0.0, got64), torch.where(both_inf, 0.0, exp64)
    if bool(torch.isinf(got64).any() | torch.isinf(exp64).any()):
        index = tuple(int(i) for i in (torch.isinf(got64) != torch.isinf(exp64)).nonzero()[0])
        run.fail(f"'{name}' is infinite where the reference is not (or vice versa) at {_where(index)}: "
                 f"got {float(got[index])}, expected {float(expected[index])}")
    ratio, diff, scale = row_error_ratios(got64, exp64, rtol, row_dims)
    if ratio.numel() and float(ratio.max()) > 1.0:
        worst = tuple(int(i) for i in (ratio == ratio.max()).nonzero()[0])
        rel = float(diff[worst] / max(float(scale[worst]), 1e-300))
        run.fail(f"'{name}' differs from the reference beyond tolerance at row {_where(worst)}: relative error "
                 f"{rel:.3e} (normwise) > rtol {rtol:.3e}; {int((ratio > 1).sum())} of {ratio.numel()} rows fail")


def row_error_ratios(got: torch.Tensor, expected: torch.Tensor, rtol: float, row_dims: int = 1):
    """Each row's error norm over its bound in :func:`assert_rows_close` (> 1 fails): ``(ratio, error norm, row
    norm)``, each shaped as the tensors' leading dims; the bound is ``rtol * (row norm + 1e-3 * max row norm)``.
    Finite float tensors of one shape (the caller handles infinities and NaN)."""
    got64, exp64 = got.double(), expected.double()
    lead = got64.shape[: got64.dim() - row_dims]
    diff = (got64 - exp64).reshape(*lead, -1).norm(dim=-1)
    scale = exp64.reshape(*lead, -1).norm(dim=-1)
    floor = 1e-3 * float(scale.max()) if scale.numel() else 0.0
    return diff / (rtol * (scale + floor) + 1e-30), diff, scale


def assert_lse_close(run, name: str, got: torch.Tensor, expected: torch.Tensor, rtol: float) -> None:
    """-inf exactly where expected; elsewhere ``|Δ| <= rtol * (1 + |expected|)`` (an lse error is
    the relative error of the softmax denominator)."""
    got, expected = _cpu(got, expected)
    assert_no_nan(run, name, got)
    assert_same_neg_inf(run, name, got, expected)
    finite = torch.isfinite(expected)
    err = (got.double() - expected.double()).abs()
    bound = rtol * (1.0 + expected.double().abs())
    bad = finite & ~(err <= bound)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        run.fail(f"'{name}' differs from the reference at {_where(index)}: got {float(got[index]):.6g}, expected "
                 f"{float(expected[index]):.6g} (natural-log lse; ratio {float(got[index] / expected[index]):.4f}); "
                 f"{int(bad.sum())} entries beyond rtol {rtol:.2e}")


def assert_equal(run, name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality (integer results, untouched memory)."""
    got, expected = _cpu(got, expected)
    if got.shape != expected.shape:
        run.fail(f"'{name}' expected shape {list(expected.shape)}, got {list(got.shape)}")
    if not torch.equal(got.to(expected.dtype), expected):
        index = tuple(int(i) for i in (got.to(expected.dtype) != expected).nonzero()[0])
        run.fail(f"'{name}' differs at {_where(index)}: got {got[index].tolist()}, expected {expected[index].tolist()}"
                 f" ({int((got.to(expected.dtype) != expected).sum())} entries differ)")


def assert_bitwise(run, name: str, got: torch.Tensor, expected: torch.Tensor, context: str) -> None:
    """Bit-for-bit identity (batch invariance)."""
    got, expected = _cpu(got, expected)
    a, b = got.contiguous(), expected.contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        run.fail(f"'{name}' {context}: dtype/shape changed ({a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)})")
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = a.view(bits) != b.view(bits)
    if bool(differ.any()):
        index = tuple(int(i) for i in differ.nonzero()[0])
        run.fail(f"'{name}' is not bitwise identical {context}: at {_where(index)} {float(a[index])!r} vs "
                 f"{float(b[index])!r} ({int(differ.sum())} entries differ)")


def assert_topk_rows(run, got: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, k: int,
                     expected: torch.Tensor, *, exact_set: bool, what: str = "topk") -> None:
    """A valid top-k per row: valid ids first then -1 padding, distinct, inside the row's length,
    never a -inf score, as many as the reference, and the reference's score multiset. With
    ``exact_set``: exactly the reference's id set (the tie rule: smaller index wins)."""
    assert_shape_dtype(run, what, got, (scores.shape[0], k), (torch.int32, torch.int64), device=scores.device)
    got, scores, lengths, expected = _cpu(got, scores, lengths, expected)
    for t in range(scores.shape[0]):
        row, ref = got[t].long(), expected[t].long()
        valid, ref_valid = row[row >= 0], ref[ref >= 0]
        prefix = f"row {t} (length {int(lengths[t])}, k {k}): "
        count = int(valid.numel())
        if bool((row[:count] < 0).any()) or bool((row[count:] >= 0).any()) or bool((row < -1).any()):
            run.fail(prefix + f"expected valid ids first then -1 padding, got {row.tolist()}")
        if count != ref_valid.numel():
            run.fail(prefix + f"selected {count} entries, the reference selects {ref_valid.numel()} "
                     f"(got {sorted(valid.tolist())}, expected {sorted(ref_valid.tolist())})")
        if torch.unique(valid).numel() != count:
            run.fail(prefix + f"an index is selected twice: {row.tolist()}")
        if count and (int(valid.max()) >= int(lengths[t]) or int(valid.min()) < 0):
            run.fail(prefix + f"index outside [0, {int(lengths[t])}): {sorted(valid.tolist())}")
        picked, wanted = scores[t, valid], scores[t, ref_valid]
        if bool((picked == float("-inf")).any()):
            run.fail(prefix + f"selected a -inf (masked) entry: {sorted(valid.tolist())}")
        if not torch.equal(torch.sort(picked).values, torch.sort(wanted).values):
            run.fail(prefix + "score multiset differs from the reference's: got scores "
                     f"{sorted(picked.tolist(), reverse=True)}, expected {sorted(wanted.tolist(), reverse=True)}")
        if exact_set and set(valid.tolist()) != set(ref_valid.tolist()):
            extra = sorted(set(valid.tolist()) - set(ref_valid.tolist()))
            missing = sorted(set(ref_valid.tolist()) - set(valid.tolist()))
            run.fail(prefix + f"tie rule violated (smaller index must win among equal scores): selected {extra} "
                     f"instead of {missing} (scores {scores[t, extra].tolist()} vs {scores[t, missing].tolist()})")


def assert_untouched(run, what: str, after: torch.Tensor, before: torch.Tensor, mask: torch.Tensor | None = None,
                     describe=None) -> None:
    """Memory an op must not write (a read-only op's cache, other layers' bytes around a view, guard
    rows) is bitwise what it was. ``mask``: only these elements are checked (None: all).
    ``describe(index) -> str`` names the first changed element for the message."""
    after, before = _cpu(after, before)
    if after.dtype == torch.uint8:
        changed = after != before
    else:  # compare bits: NaN payloads and -0.0 count as data too
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[after.element_size()]
        changed = after.contiguous().view(bits) != before.contiguous().view(bits)
    if mask is not None:
        changed &= _cpu(mask)[0]
    if bool(changed.any()):
        index = tuple(int(i) for i in changed.nonzero()[0])
        where = describe(index) if describe is not None else _where(index)
        run.fail(f"{what} changed: first at {where} ({int(changed.sum())} elements changed)")
