"""A bound on how many alignment-specialised variants of each Triton kernel one process compiles.

Why. Triton compiles a kernel once per *specialisation*: besides the constexpr values it records, for
every pointer argument, whether its address is a multiple of 16 bytes, and for every integer argument
not marked ``do_not_specialize``, whether it is a multiple of 16 (or 1). A serving process sees one or
two such patterns per kernel (its tensors' strides do not change), so this costs nothing there. The
conformance suite draws page views with guard bytes around records, pools with padded rows, queries
sliced out of fused projections: nearly every example is a new pattern, so nearly every example
recompiled (~2 s each on the H200, 2026-12-01), which capped the GPU suite at ~10 examples per property.

What. With a budget of ``N`` (``DSAHAL_TRITON_COMPILE_BUDGET=N``; the conformance CLI sets it), each
launched kernel (a module-level ``*_kernel`` of :mod:`dsahal.backends.triton_kernels`) keeps Triton's
specialised compile for the first ``N`` alignment patterns seen per constexpr configuration, exactly as
without the budget; every further pattern runs one *generic twin* of the kernel: the same source
compiled with no alignment or divisibility assumptions, correct for any pattern (possibly with
narrower loads), compiled once per constexpr configuration. Which variant serves a pattern is decided
the first time it is seen and never changes in the process, so a call repeated gives the same bits.

Batch-invariant mode (``DSAHAL_BATCH_INVARIANT=1``) runs *every* launch on the twin (a budget of 0).
Alignment facts steer Triton's layouts (a 16-byte aligned row loads 4 floats per thread, an unaligned one
1), and a reduction over a differently laid-out tensor adds in a different order: a request's tensors
sliced out of a batch at an odd offset then gave other bits than the same request in the batch (H200,
2026-12-01, ``kda_decode``, 1 of 179 examples at 200). With one alignment-free compile per configuration,
a row's result cannot depend on where its tensors start.

A kernel module may name, per kernel, the arguments whose facts are the same whichever rows a batch holds
(``CACHE_ARGS``): the cache's (the latent or index pages, the KDA state pool: their pointers, strides and dims) and
values fixed with it (a head dim; an output the launcher allocates from those dims). In batch-invariant mode a call
runs a second twin that keeps the facts of those arguments, whatever they are (Triton specialises them at run time as
usual: one compile per pattern), and assumes none about the batch's own tensors: the cache's loads stay vectorised.
Byte-addressed formats were 7.7-9x slower on the fully generic twin (the general sparse-MLA kernel on fp8 latents,
H200, twenty-fourth session). Which twin serves a call, and what it knows, depends on the cache alone, so a row still
gets the same bits in any batch over that cache. Each constexpr configuration keeps
:data:`INVARIANT_CACHE_PATTERNS` cache patterns (a serving process has one cache; the conformance suite draws many);
calls over a cache beyond them run the fully generic twin, decided once per cache pattern. (Until the thirty-first
session only a cache whose every fact was "aligned" took this twin: fp8_ds_mla pages, whose 16- and 32-bit views
have token strides of 328 and 164 elements, ran the fully generic twin, 3.5x the default compile's main-loop
instructions at H = 128: the DSA layer took 7.59 ms in batch-invariant mode against 2.09 without FlashMLA, H200,
thirtieth session.)

A kernel module may also name arguments its launcher makes 16-byte aligned pointers and multiples of 16 on every
call, whatever the batch (``LAUNCHER_ALIGNED_ARGS``: it copies (:mod:`.alignment`) or allocates those tensors so):
their facts are then the same in every batch, and the cache twin keeps them too. A call that breaks the promise is a
dsahal bug and raises. Without them the general sparse-MLA kernel's queries and outputs were unaligned in that twin,
and its sm_90 main loop (H = 128, fp8_ds_mla) ran 2,874 instructions against the default compile's 1,866 (thirty-first
session, ``python -m dsahal.backends.nvidia.aot --invariant``); with both declared, every twinned kernel of the
sparse-MLA, indexer block-tile, top-k (bound and groups methods), KDA and LSE-combine launches compiles to the default
compile's SASS, instruction for instruction.

Without either variable nothing is installed: launches are the launch cache's (:mod:`dsahal.kernel_launch`)
with no added cost. Under ``TRITON_INTERPRET=1`` nothing is compiled and nothing is installed.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Any

import torch

from dsahal import kernel_launch as launcher

from ..batch_mode import invariant_requested

ENV = "DSAHAL_TRITON_COMPILE_BUDGET"
LAUNCH_OPTIONS = launcher.LAUNCH_OPTIONS

_installed: dict[str, "BudgetedKernel"] = {}

# Cache patterns (the cache arguments' alignment facts) each constexpr configuration compiles a cache twin for in
# batch-invariant mode; a serving process sees one, the conformance suite's drawn page views several.
INVARIANT_CACHE_PATTERNS = 4
CONFIG_MEMO = 256  # launch sites' keyword tuples memoised per kernel (BudgetedKernel._config)


def budget_from_env() -> int | None:
    """The budget ``DSAHAL_TRITON_COMPILE_BUDGET`` asks for (``None``: unset, empty or 0)."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{ENV} must be a non-negative integer (alignment patterns per kernel), got {text!r}") from None
    if value < 0:
        raise ValueError(f"{ENV} must be a non-negative integer (alignment patterns per kernel), got {value}")
    return value or None


def _fact(value) -> Any:
    """What Triton specialises a run-time argument on: a tensor's 16-byte alignment, an integer's being a multiple of
    16 and being 1 (None for anything else)."""
    if isinstance(value, torch.Tensor):
        return not value.data_ptr() % 16
    if type(value) is int:  # (not a bool)
        return (not value % 16, value == 1)
    return None


class BudgetedKernel:
    """``kernel[grid](*args, **kwargs)`` that sends alignment patterns beyond the budget to a generic twin.

    Args:
        kernel: a ``triton.jit`` function (launched, not a device helper).
        budget: specialised alignment patterns kept per constexpr configuration (>= 1); 0 is batch-invariant mode.
        cache_args: the arguments that describe the cache (the module's ``CACHE_ARGS``).
        launcher_aligned: the arguments the launcher makes aligned on every call (``LAUNCHER_ALIGNED_ARGS``).
    """

    def __init__(self, kernel, budget: int, cache_args: tuple = (), launcher_aligned: tuple = ()):
        if not isinstance(kernel, launcher.LaunchedKernel):
            kernel = launcher.LaunchedKernel(kernel, launcher.cache_enabled())
        self.kernel = kernel
        self.kernel_name = getattr(kernel.fn, "__name__", str(kernel))
        self.budget = budget
        self.params = list(kernel.params)
        self.names = [p.name for p in self.params]
        self.constexpr = {p.name for p in self.params if p.is_constexpr}
        self.unspecialised = {p.name for p in self.params if p.do_not_specialize}
        runtime = [p.name for p in self.params if not p.is_constexpr]
        for role, names in (("cache", cache_args), ("launcher-aligned", launcher_aligned)):
            unknown = [name for name in names if name not in runtime]
            if unknown:
                raise ValueError(f"compile budget: {role} arguments {unknown} are not run-time parameters of "
                                 f"{self.kernel_name}")
        self.twin = self._twin(runtime)
        # the arguments the kernel itself specialises (its do_not_specialize ones stay generic)
        self.cache_args = tuple(name for name in cache_args if name not in self.unspecialised)
        self.launcher_aligned = tuple(name for name in launcher_aligned if name not in self.unspecialised)
        self.cache_positions = tuple(self.names.index(name) for name in self.cache_args)
        self.aligned_positions = tuple(self.names.index(name) for name in self.launcher_aligned)
        self.constexpr_positions = tuple(i for i, name in enumerate(self.names) if name in self.constexpr)
        self.config_names = frozenset(self.constexpr) | frozenset(LAUNCH_OPTIONS)
        self.config_of: dict[tuple, tuple] = {}  # _config's memo: a call's keywords -> its configuration key
        kept = set(self.cache_args) | set(self.launcher_aligned)
        self.cache_twin = self._twin([name for name in runtime if name not in kept]) if kept else None
        self.seen: dict[tuple, set] = {}
        self.decided: dict[tuple, bool] = {}  # (config, pattern) -> specialised (or: a cache twin)?
        self.generic_calls = 0
        self.cache_calls = 0

    def _twin(self, generic: list) -> "launcher.LaunchedKernel":
        """The kernel compiled with no alignment or divisibility facts about the ``generic`` arguments."""
        import triton

        try:
            twin = triton.jit(self.kernel.fn, do_not_specialize=generic, do_not_specialize_on_alignment=generic)
        except TypeError:  # a Triton without alignment control: do_not_specialize covers both there
            twin = triton.jit(self.kernel.fn, do_not_specialize=generic)
        return launcher.LaunchedKernel(twin, self.kernel.enabled)

    def cache_pattern(self, args, kwargs) -> tuple:
        """The cache arguments' alignment facts, as Triton specialises them: a tensor's 16-byte alignment, an
        integer's being a multiple of 16 and being 1. (Runs on every batch-invariant launch: kept lean.)"""
        count = len(args)
        return tuple(_fact(args[position] if position < count else kwargs.get(name))
                     for position, name in zip(self.cache_positions, self.cache_args))

    def check_launcher_aligned(self, args, kwargs) -> None:
        """Raise unless every launcher-aligned argument is a 16-byte aligned tensor or a multiple of 16 (the
        launcher's promise: a call that broke it would give a row other bits in another batch)."""
        count = len(args)
        for position, name in zip(self.aligned_positions, self.launcher_aligned):
            value = args[position] if position < count else kwargs.get(name)
            if isinstance(value, torch.Tensor):
                if not value.data_ptr() % 16:
                    continue
                shown = f"address {value.data_ptr():#x}"
            elif type(value) is int and not value % 16:
                continue
            else:
                shown = repr(value)
            raise RuntimeError(f"compile budget: {self.kernel_name}'s launcher promises {name} 16-byte aligned or a "
                               f"multiple of 16 (LAUNCHER_ALIGNED_ARGS), got {shown}: a dsahal bug")

    def _pattern(self, args, kwargs) -> tuple[tuple, tuple]:
        config = []
        pattern = []
        for name, value in zip(self.names, args):
            self._classify(name, value, config, pattern)
        for name, value in sorted(kwargs.items()):
            self._classify(name, value, config, pattern)
        return tuple(config), tuple(pattern)

    def _classify(self, name: str, value: Any, config: list, pattern: list) -> None:
        if name in self.constexpr or name in LAUNCH_OPTIONS:
            config.append((name, value))
        elif isinstance(value, torch.Tensor) or name not in self.unspecialised:
            pattern.append(_fact(value))
        else:
            pattern.append(None)

    def _keep(self, config: tuple, pattern: tuple, limit: int) -> bool:
        """Whether ``pattern`` is among the first ``limit`` of ``config`` (decided once, never changed)."""
        key = (config, pattern)
        choice = self.decided.get(key)
        if choice is None:
            kept = self.seen.setdefault(config, set())
            choice = len(kept) < limit
            if choice:
                kept.add(pattern)
            self.decided[key] = choice
        return choice

    def specialised(self, args, kwargs) -> bool:
        """Whether this call's pattern runs the specialised kernel (decided once per pattern; never with a
        budget of 0, always with ``None``)."""
        if self.budget is None:
            return True
        if self.budget == 0:
            return False
        return self._keep(*self._pattern(args, kwargs), self.budget)

    def cache_twin_serves(self, args, kwargs) -> bool:
        """Batch-invariant mode: whether the cache twin serves this call (its cache's pattern among the first
        :data:`INVARIANT_CACHE_PATTERNS` of its configuration; decided by the cache alone)."""
        if self.cache_twin is None:
            return False
        self.check_launcher_aligned(args, kwargs)
        return self._keep(self._config(args, kwargs), self.cache_pattern(args, kwargs), INVARIANT_CACHE_PATTERNS)

    def _config(self, args, kwargs) -> tuple:
        """The call's constexpr configuration as a cache-twin key (this runs on every batch-invariant launch: the
        run-time arguments are not classified here, unlike :meth:`_pattern`)."""
        try:  # a launch site passes the same keywords in the same order every time: memoised on them
            seen = (tuple(args[i] for i in self.constexpr_positions if i < len(args)), tuple(kwargs.items()))
            return self.config_of[seen]
        except KeyError:
            pass
        except TypeError:  # an unhashable keyword value: not memoised
            seen = None
        config = [(self.names[i], args[i]) for i in self.constexpr_positions if i < len(args)]
        keyed = self.config_names
        config += sorted(item for item in kwargs.items() if item[0] in keyed)
        config = ("cache twin", *config)
        if seen is not None and len(self.config_of) < CONFIG_MEMO:  # (bounded: a caller could pass tensors by keyword)
            self.config_of[seen] = config
        return config

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.specialised(args, kwargs):
                return self.kernel[grid](*args, **kwargs)
            if self.budget == 0 and self.cache_twin_serves(args, kwargs):
                self.cache_calls += 1  # batch-invariant mode: the cache's facts kept
                return self.cache_twin[grid](*args, **kwargs)
            self.generic_calls += 1
            return self.twin[grid](*args, **kwargs)

        return launch

    def stats(self) -> dict:
        """Patterns kept specialised and calls sent to the twins (for reports and tests)."""
        kept = sum(len(p) for c, p in self.seen.items() if c[:1] != ("cache twin",))
        return {"specialised_patterns": kept, "generic_calls": self.generic_calls, "cache_twin_calls": self.cache_calls}


def kernel_modules():
    """This package's kernel modules, each imported (the budget wraps the kernels of all of them)."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == __name__.rsplit(".", 1)[-1]:
            continue
        try:
            yield importlib.import_module(f"{__package__}.{info.name}")
        except ImportError:
            if info.name != "sparse_mla_gluon":  # (needs a Triton with Gluon; its route declines without one)
                raise


def install(budget: int | None = None, *, invariant: bool = False) -> dict[str, BudgetedKernel]:
    """Wrap every launched kernel of this package (each already behind its launch cache,
    :mod:`dsahal.kernel_launch`) in a :class:`BudgetedKernel`, or set the budget of the wrappers already
    installed (a registry rebuilt in another mode).

    ``budget`` defaults to :func:`budget_from_env`; ``invariant`` (batch-invariant mode, also taken from
    ``DSAHAL_BATCH_INVARIANT`` whoever calls) makes it 0: every launch on the alignment-free twin. With no
    budget and not invariant, no budget wrapper is added and installed ones pass every call through.
    Nothing under ``TRITON_INTERPRET=1``. Returns the budget wrappers by ``module:name``.
    """
    # The mode is the process's (one variable for every backend): a plugin that installs without naming it
    # must not undo another's budget of 0 (the PPU plugin's declaration, built after nvidia's, reset it to
    # the suite's 4 on the H200, 2026-12-01: kda_decode rows then depended on the batch again).
    invariant = invariant or invariant_requested()
    budget = 0 if invariant else (budget_from_env() if budget is None else budget)
    if launcher.interpreted():
        return dict(_installed)
    for wrapper in _installed.values():
        wrapper.budget = budget or (0 if invariant else None)
    if budget is None or (budget == 0 and not invariant):
        return dict(_installed)
    for module in kernel_modules():
        for name, kernel in launcher.launched_kernels(module).items():
            if _is_gluon(kernel):
                # a Gluon kernel's layouts are written out, not derived from alignment facts (so a row's bits do not
                # depend on where its tensors start), and its copies need the 16-byte alignment its verifier checks:
                # an alignment-free twin (a plain triton.jit of its source, besides) would not compile
                continue
            wrapper = BudgetedKernel(kernel, budget, *declarations(kernel))
            setattr(module, name, wrapper)
            _installed[f"{module.__name__}:{name}"] = wrapper
    return dict(_installed)


def declarations(kernel) -> tuple[tuple, tuple]:
    """``(CACHE_ARGS, LAUNCHER_ALIGNED_ARGS)`` of ``kernel`` (possibly behind the launch cache), as the module that
    defines it declares them: a module launching another's kernel by name (topk_groups launches two of topk_bound's)
    gets the same declarations."""
    fn = launcher.triton_launch(kernel).fn
    owner = importlib.import_module(fn.__module__)
    return (getattr(owner, "CACHE_ARGS", {}).get(fn.__name__, ()),
            getattr(owner, "LAUNCHER_ALIGNED_ARGS", {}).get(fn.__name__, ()))


def _is_gluon(kernel) -> bool:
    """Whether ``kernel`` (possibly behind the launch cache) is a ``gluon.jit`` function."""
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:  # a Triton without Gluon has no Gluon kernels
        return False
    return isinstance(launcher.triton_launch(kernel), GluonJITFunction)


def installed() -> dict[str, BudgetedKernel]:
    return dict(_installed)
