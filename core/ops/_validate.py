"""Cheap argument checks shared by every op: type, rank, shape, dtype, device.

Every check raises with the same message shape so a user can read what went wrong:
``dsahal.<op>: argument '<name>' expected <what>, got <what>``. ``TypeError`` for a wrong
Python type or dtype, ``ValueError`` for a wrong shape, device or value. Nothing here reads
tensor *contents* (that would synchronise a GPU): only metadata.
"""
from __future__ import annotations

import operator
from typing import Iterable, Sequence

import torch

from ..formats.base import CacheFormat, scale_limit_text
from ..formats.numerics import FP32_MAX
from ._dispatch import tracing

_Tensor = torch.Tensor
_dtype = torch.dtype
Dim = int | str | None  # an exact size, a named size bound on first sight, or "any"


class _ShapeText:
    """``[T, H, *]`` for messages, built only when printed."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = shape

    def __str__(self) -> str:
        return "[" + ", ".join("*" if d is None else str(d) for d in self.shape) + "]"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731 - f-strings call __format__


class ShapeBinder:
    """Binds named dimensions (``"T"``, ``"H"``) across the arguments of one op call.

    The success path is the hot path (every validated op call runs it): no message text, tuple or
    dict is built there, and where each named size was bound is not recorded; an error recomputes it
    from the argument specs kept in ``_specs`` (one append per tensor checked).
    """

    __slots__ = ("op", "sizes", "_given", "_specs")

    def __init__(self, op: str, **known: int):
        self.op = op
        self.sizes: dict[str, int] = known  # (a fresh dict per call: the ** collects into a new one)
        self._given = tuple(known) if known else ()
        self._specs: list[tuple[str, Sequence[Dim]]] = []  # (argument, shape spec) of each tensor passed

    def tensor(
        self,
        name: str,
        value: object,
        shape: Sequence[Dim],
        dtypes: Iterable[torch.dtype] | torch.dtype | None = None,
        *,
        device: torch.device | None = None,
        optional: bool = False,
        last_dim_contiguous: bool = False,
    ) -> None:
        if value.__class__ is not _Tensor and not isinstance(value, _Tensor):
            if value is None and optional:
                return
            self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        if dtypes is not None:
            dtype = value.dtype
            if dtype is not dtypes and (dtypes.__class__ is _dtype or dtype not in dtypes):
                self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        sizes = value.shape
        if len(sizes) != len(shape):
            self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        bound = self.sizes
        for want, got in zip(shape, sizes):
            if want is None:
                continue
            if want.__class__ is str:
                have = bound.get(want)
                if have is None:
                    bound[want] = got
                elif got != have:
                    self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
            elif got != want:
                self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        if device is not None and value.device != device:
            self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        if last_dim_contiguous and sizes and sizes[-1] > 1 and value.stride()[-1] != 1:
            self._tensor_error(name, value, shape, dtypes, device, last_dim_contiguous)
        self._specs.append((name, shape))  # last: the specs of the arguments that passed, for _where

    def _where(self, size_name: str):
        """Where a named size was bound before the argument being checked: ``"given"``, ``(argument,
        dim)`` of its first sight in an argument that passed, or None (not bound before it)."""
        if size_name in self._given:
            return "given"
        for arg, spec in self._specs:
            for axis, want in enumerate(spec):
                if want == size_name:
                    return arg, axis
        return None

    def _tensor_error(self, name, value, shape, dtypes, device, last_dim_contiguous) -> None:
        """Raise the error :meth:`tensor` found, with its message; the sizes this argument bound before
        the failing dim are recomputed here (the fast path does not record them)."""
        if value is None:
            raise TypeError(f"dsahal.{self.op}: argument '{name}' expected a tensor, got None")
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"dsahal.{self.op}: argument '{name}' expected a torch.Tensor, got {type(value).__name__}"
            )
        if dtypes is not None:
            allowed = (dtypes,) if isinstance(dtypes, torch.dtype) else dtypes
            if value.dtype not in allowed:
                names = " or ".join(str(d).replace("torch.", "") for d in allowed)
                raise TypeError(
                    f"dsahal.{self.op}: argument '{name}' expected dtype {names}, "
                    f"got {str(value.dtype).replace('torch.', '')}"
                )
        expected = _ShapeText(shape)
        if value.dim() != len(shape):
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected a {len(shape)}-d tensor of shape "
                f"{expected}, got shape {list(value.shape)}"
            )
        bound_here: dict[str, tuple[int, tuple[str, int]]] = {}  # names first bound by this argument
        for axis, want in enumerate(shape):
            got = value.shape[axis]
            if want is None:
                continue
            if isinstance(want, str):
                if want in bound_here:
                    want_size, where = bound_here[want]
                else:
                    where = self._where(want)
                    if where is None:
                        bound_here[want] = (got, (name, axis))
                        self.sizes[want] = got
                        continue
                    want_size = self.sizes[want]
            else:
                want_size = want
            if got != want_size:
                if isinstance(want, str):
                    where = f"'{where[0]}' dim {where[1]}" if isinstance(where, tuple) else where
                    source = f" ({want}={want_size} from {where})"
                else:
                    source = ""
                raise ValueError(
                    f"dsahal.{self.op}: argument '{name}' expected shape {expected}{source}, "
                    f"got shape {list(value.shape)} (dim {axis} is {int(got)})"
                )
        if device is not None and value.device != device:
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected device {device}, got {value.device}"
            )
        if last_dim_contiguous and value.dim() and value.shape[-1] > 1 and value.stride(-1) != 1:
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected unit stride in its last dim, "
                f"got strides {list(value.stride())}"
            )
        raise AssertionError(f"dsahal.{self.op}: argument '{name}': a check failed but no error was found")

    def positive_int(self, name: str, value: object, *, minimum: int = 1) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"dsahal.{self.op}: argument '{name}' expected an int, got {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"dsahal.{self.op}: argument '{name}' expected an int >= {minimum}, got {value}")

    def positive_float(self, name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"dsahal.{self.op}: argument '{name}' expected a float, got {type(value).__name__}")
        if not (value > 0.0 and value <= FP32_MAX):  # kernels take it as an fp32: past FP32_MAX it is inf
            raise ValueError(f"dsahal.{self.op}: argument '{name}' expected a finite float > 0 (at most {FP32_MAX:.8g}: "
                             f"the kernels take it as an fp32), got {value}")

    def flag(self, name: str, value: object) -> None:
        """A boolean flag: ``True``/``False`` only (a string such as ``"no"`` would read as true)."""
        if not isinstance(value, bool):
            raise TypeError(f"dsahal.{self.op}: argument '{name}' expected a bool, got {type(value).__name__} {value!r}")

    def at_most(self, name: str, value: int, limit: int, what: str) -> None:
        """``value <= limit`` for a count derived from argument metadata (``what`` says which count)."""
        if value > limit:
            raise ValueError(f"dsahal.{self.op}: argument '{name}' expected {what} at most {limit}, got {value}")

    def disjoint(self, name: str, value: torch.Tensor, what: str) -> None:
        """No two elements of ``value`` share memory, read from its shape and strides (no device sync).

        Pages ``[blocks, block_tokens, token_bytes]`` (unit stride in the last dim) pass when no two
        ``[block, token]`` records overlap; a KDA pool ``[P, H, K, V]`` when no two states (or elements of
        one) alias. The check is the sufficient lattice rule: ordered by stride, each dim of size > 1
        steps past everything the smaller-stride dims span. Every layout dsahal makes passes it
        (contiguous tensors, packed-pool pages with ``stride(0) = row_bytes``, states as strided row runs,
        padded or permuted views); stride 0 (``expand``) and half-overlapping steps fail.
        """
        bad = _overlap(value.shape, value.stride())
        if bad is not None:
            axis, step, span = bad
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected strides under which no two {what} share memory, "
                f"got shape {list(value.shape)} with strides {list(value.stride())} (dim {axis} steps {step} "
                f"elements, not past the {span} element(s) that the dims of smaller stride span)"
            )

    def writable(self, name: str, value: torch.Tensor) -> None:
        """``value`` (a tensor argument written in place) can take the write where the op runs: not a tensor
        that requires grad while autograd records (the reference's in-place write fails deep inside with
        autograd's own error, a kernel writing through the pointer would bypass autograd silently), nor an
        inference tensor outside ``torch.inference_mode()`` (the same split: torch refuses the reference's
        write, a kernel's would go through). While tracing or compiling only the first is checked: dynamo
        cannot trace ``is_inference()`` (a graph break, an error under ``fullgraph=True``), and the compiled
        call refuses an inference tensor's write itself (torch 2.13: "Inplace update to inference tensor")."""
        if value.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected a tensor that does not require grad (it is written "
                f"in place: pass a detached tensor or call under torch.no_grad()), got one with requires_grad=True"
            )
        if tracing():
            return
        if value.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected a tensor that can be written in place here, got an "
                f"inference tensor outside torch.inference_mode() (call under inference_mode, or pass a clone)"
            )

    def choice(self, name: str, value: object, choices: Iterable[str]) -> None:
        options = tuple(choices)
        if value not in options:
            raise ValueError(f"dsahal.{self.op}: argument '{name}' expected one of {list(options)}, got {value!r}")

    def same_device(self, **tensors: torch.Tensor | None) -> None:
        first = None
        for value in tensors.values():
            if value is None:
                continue
            if first is None:
                first = value.device
            elif value.device != first:
                break
        else:
            return
        present = {k: v for k, v in tensors.items() if v is not None}
        if True:
            listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
            raise ValueError(f"dsahal.{self.op}: expected all tensors on one device, got {listing}")

    def has_data(self, name: str, value: torch.Tensor) -> None:
        """``value`` (every tensor of the call: :meth:`same_device` passed) has storage, for an op whose
        result depends on the values it reads (slots, ids, lengths): on the ``meta`` device its reference
        would fail deep inside (``Tensor.item() cannot be called on meta tensors``) and a kernel would read
        nothing. Skipped while tracing or compiling, where tensors stand in for shapes by design."""
        if value.device.type == "meta" and not tracing():
            raise ValueError(
                f"dsahal.{self.op}: argument '{name}' expected a tensor with data (this op reads values), got a "
                f"tensor on the meta device (shapes only: materialise it, or trace the op with fake tensors)"
            )

    def split_sizes(self, name: str, value: object, world: int) -> list[int] | None:
        """A sequence of ``world`` non-negative ints (None passes through). Each entry must be an int
        (``operator.index``: Python and NumPy ints, integer 0-d tensors), not a bool, float or string:
        ``int(4.5)`` would silently move 4 rows."""
        if value is None:
            return None
        try:
            sizes = [operator.index(s) for s in value if not isinstance(s, bool)]
            complete = len(sizes) == len(value)
        except TypeError:
            complete = False
        if not complete:
            raise TypeError(f"dsahal.{self.op}: argument '{name}' expected a sequence of {world} ints, "
                            f"got {type(value).__name__} {value!r}")
        if len(sizes) != world or any(s < 0 for s in sizes):
            raise ValueError(f"dsahal.{self.op}: argument '{name}' expected {world} non-negative sizes, got {sizes}")
        return sizes

    def fail(self, message: str, *, type_error: bool = False) -> None:
        raise (TypeError if type_error else ValueError)(f"dsahal.{self.op}: {message}")


def _overlap(shape, strides) -> tuple[int, int, int] | None:
    """(axis, its stride, the span below it) of the first dim whose step lands inside what the dims of
    smaller stride already cover, or None when every element has its own memory (sufficient test)."""
    if any(size == 0 for size in shape):
        return None  # an empty tensor has no elements to alias
    span = 0  # elements covered by the dims taken so far, minus one: the largest offset they reach
    for stride, size, axis in sorted((stride, size, axis) for axis, (size, stride) in enumerate(zip(shape, strides))
                                     if size > 1):
        if stride <= span:
            return axis, stride, span + 1
        span += stride * (size - 1)
    return None


INT32_MAX = 2**31 - 1  # slots, positions and ids are int32 in every kernel: counts that become them must fit
INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ANY_FLOAT_DTYPES = FLOAT_DTYPES + (torch.float64,)


def can_read_values(t: torch.Tensor) -> bool:
    """Value checks read tensor contents (a device sync): never while tracing or graph capture."""
    if torch.compiler.is_compiling():
        return False
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return t.device.type != "meta"


def values_in_range(op: str, name: str, t: torch.Tensor, low: int, high: int, *, what: str = "") -> None:
    """Every element in ``[low, high]`` (inclusive); skipped where contents cannot be read."""
    if t.numel() == 0 or not can_read_values(t):
        return
    t_min, t_max = int(t.min()), int(t.max())
    if t_min < low or t_max > high:
        bad = t_min if t_min < low else t_max
        raise ValueError(
            f"dsahal.{op}: argument '{name}' expected values in [{low}, {high}]{what}, got {bad}"
        )


def positive_scale(op: str, name: str, t: torch.Tensor, fmt: CacheFormat) -> None:
    """A per-tensor scale (``[]`` fp32, shape checked already) is finite and > 0, and at most the largest
    scale of ``fmt`` (the fp8 latent's ``448 * scale`` must be a finite fp32, or saturated records decode to
    Inf); skipped where contents cannot be read. Checked even when nothing would read it (every row empty):
    it is the call's argument."""
    if not can_read_values(t):
        return
    value = float(t)
    if not fmt.accepts_scale(value):
        raise ValueError(f"dsahal.{op}: argument '{name}' expected a finite value > 0{scale_limit_text(fmt)}, "
                         f"got {value}")
