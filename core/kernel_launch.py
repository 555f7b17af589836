"""One way to launch dsahal's Triton kernels: ``kernel[grid](...)`` through a cache of compiled kernels.

The backends' shared kernels (:mod:`dsahal.backends.triton_kernels`) and the model's fused elementwise kernels
(:mod:`dsahal.model.fused`) wrap theirs with :func:`wrap_launched` as their modules' last statement.

Why. Triton's own launch (``JITFunction.run``, Triton 3.6 on the H200) redoes per call what a serving
process never changes: it binds the arguments, builds a cache key that prints the options dict, reads the
current device, checks the kernel's globals, builds a launch-metadata dict for hooks nobody installed, and
hands its C launcher two empty hook chains to call. On the H200's hosts a launch cost 14-24 µs, of which the
C launch itself (argument parsing, the driver's check of each tensor's address, ``cuLaunchKernelEx``) is
4.4-7.0 µs (BENCHMARKS.md, twelfth session), and a decode step makes dozens of launches.

What. :class:`LaunchedKernel` wraps a ``triton.jit`` kernel. Each call computes a key from exactly what
Triton specialises a compile on (and a little more, never less), so two calls with one key always run the
same compiled kernel:

- every tensor: its dtype, whether its address is a multiple of 16 bytes;
- every integer: whether it is 1 and whether it is a multiple of 16 (unless the kernel marks it
  ``do_not_specialize``), and whether it fits int32 / int64;
- constexprs, ``None``, booleans, launch options (``num_warps``, ...) and keyword arguments: their values;
- floats: the type only (their value is a run-time argument);
- the current device.

The first call with a key goes through Triton's own launch (it compiles if needed, and launches) and keeps
the compiled kernel it returns; later calls with that key hand the arguments straight to the compiled
kernel's launcher (whose C code reads each tensor's address and checks, as always, that the GPU can reach
it). Anything unusual takes Triton's path every time, never a
guess: a callable grid, an argument of another type, a launch hook installed (a profiler such as Proton
sees every launch), a JIT pre-run hook, a Triton whose compiled kernels lack the launch interface this
relies on (probed once per compile), more than :data:`MAX_KEYS` keys for one kernel.

Off with ``DSAHAL_FAST_LAUNCH=0`` (read once, when the wrappers are installed), and under
``TRITON_INTERPRET=1`` (nothing is compiled there). Correctness does not depend on it: the H200 conformance
runs through it, and the dispatch bench times it beside Triton's own launch.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import torch

from dsahal.registry.settings import FAST_LAUNCH as ENV, env_flag

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")
MAX_KEYS = 256  # per kernel; a serving process sees a handful, the conformance suite a few dozen

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64_MAX = (1 << 63) - 1

_CONSTEXPR, _SPECIALISED, _UNSPECIALISED = 0, 1, 2


class _Unkeyed(Exception):
    """A call this wrapper does not key: it takes Triton's own launch."""


def _launch_hooks():
    """Triton's two launch-hook slots (``triton.knobs.runtime``: Triton 3.4 and later), or ``None`` where this
    Triton keeps them elsewhere (then :func:`supported` is false and nothing takes the cached path)."""
    try:
        from triton import knobs

        runtime = knobs.runtime
        runtime.launch_enter_hook, runtime.launch_exit_hook  # noqa: B018 - both must exist
        return runtime
    except (ImportError, AttributeError):
        return None


_HOOKS = None  # set by supported()


def supported() -> bool:
    """Whether this Triton offers what the cached path relies on: launch hooks in ``triton.knobs.runtime``,
    and ``pre_run_hooks`` on its JIT functions (Triton 3.6 on the H200). Else every wrapper passes its calls
    to Triton, whatever ``DSAHAL_FAST_LAUNCH`` says."""
    global _HOOKS
    if _HOOKS is None:
        _HOOKS = _launch_hooks() or False
    if _HOOKS is False:
        return False
    from triton.runtime.jit import JITFunction

    return hasattr(JITFunction, "run") and "pre_run_hooks" in JITFunction.__init__.__code__.co_names


def _hooks_active() -> bool:
    """Whether anyone installed a Triton launch hook (then every launch goes through Triton, which calls it).
    Triton 3.6 keeps hooks in a chain object (never ``None``: active when it holds a call). A Triton whose
    hooks live elsewhere counts as hooked: its launches stay Triton's own."""
    if not _HOOKS and not supported():
        return True
    for hook in (_HOOKS.launch_enter_hook, _HOOKS.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


class _Compiled:
    """What a cache hit needs of one compiled kernel (``direct``: the C launch function, ``None`` when this
    Triton's launcher does not offer it or has scratch memory to allocate per launch)."""

    __slots__ = ("kernel", "run", "function", "metadata", "tail", "direct", "cooperative", "pdl")

    def __init__(self, kernel, tail: tuple):
        self.kernel = kernel
        self.run = kernel.run  # loads the module on first use (Triton does this before launching too)
        self.function = kernel.function
        self.metadata = kernel.packed_metadata
        self.tail = tail
        launcher = self.run
        scratch = (getattr(launcher, "global_scratch_size", None), getattr(launcher, "profile_scratch_size", None))
        self.direct = None
        self.cooperative = getattr(launcher, "launch_cooperative_grid", None)
        self.pdl = getattr(launcher, "launch_pdl", None)
        # Triton 3.6's CUDA launcher: ``launch(gx, gy, gz, stream, function, cooperative, pdl, global_scratch,
        # profile_scratch, metadata, launch_metadata, enter_hook, exit_hook, *args)``; with no scratch to
        # allocate, calling it directly skips one Python frame per launch.
        if scratch == (0, 0) and self.cooperative is not None and self.pdl is not None and \
                callable(getattr(launcher, "launch", None)) and type(launcher).__name__ == "CudaLauncher":
            self.direct = launcher.launch


def _usable(kernel) -> bool:
    """Whether a compiled kernel offers what the cached launch calls (probed once per compile)."""
    return all(hasattr(kernel, name) for name in ("run", "function", "packed_metadata"))


class LaunchedKernel:
    """``kernel[grid](*args, **kwargs)`` with a cached launch (module docstring). Every other attribute is
    the wrapped ``triton.jit`` function's (``.fn``, ``.params``, ``.warmup``, ...).

    Args:
        jit: a ``triton.jit`` kernel (a launched one, not a device helper).
        enabled: take the cached path (``False``: every call is Triton's own launch).
    """

    def __init__(self, jit, enabled: bool = True):
        self.jit = jit
        self.enabled = enabled
        params = list(jit.params)
        self.names = [p.name for p in params]
        self.kinds = [_CONSTEXPR if p.is_constexpr else (_UNSPECIALISED if p.do_not_specialize else _SPECIALISED)
                      for p in params]
        self.constexpr_names = {p.name for p in params if p.is_constexpr}
        self.defaults = {p.name: p.default for p in params if p.has_default}
        self.compiled: dict[tuple, _Compiled] = {}
        self.cached_calls = 0
        self.triton_calls = 0

    def __getattr__(self, name: str) -> Any:
        jit = self.__dict__.get("jit")  # absent while copy/pickle rebuild the object: no recursion
        if jit is None:
            raise AttributeError(name)
        return getattr(jit, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    # -- the key -------------------------------------------------------------------------------------
    def _key(self, args: tuple, kwargs: dict) -> tuple:
        """The call's key (module docstring). A flat tuple, built with as few objects as the facts allow:
        it is computed on every launch."""
        if len(args) > len(self.kinds):
            raise _Unkeyed
        facts = [_current_device(), *kwargs.items()]
        fact = facts.append
        for value, kind in zip(args, self.kinds):
            cls = value.__class__
            if cls is int:
                if kind == _CONSTEXPR:
                    fact(value)
                elif -2147483648 <= value <= 2147483647:
                    # int32: 1, a multiple of 16, neither (an unspecialised one: int32 only)
                    fact(0 if kind == _UNSPECIALISED else (1 if value == 1 else (2 if value & 15 == 0 else 3)))
                else:
                    fact(4 if kind == _UNSPECIALISED or value > _INT64_MAX else (5 if value & 15 == 0 else 6))
            elif isinstance(value, torch.Tensor):
                fact(value.dtype)
                fact(value.data_ptr() & 15 == 0)
            elif cls is float:
                fact(value if kind == _CONSTEXPR else float)
            elif value is None or cls is bool or kind == _CONSTEXPR:
                fact(value)
            else:
                raise _Unkeyed
        for name in kwargs:
            if name not in self.constexpr_names and name not in LAUNCH_OPTIONS:
                raise _Unkeyed  # a run-time argument by keyword: keying it by value would grow the cache
        return tuple(facts)

    def _tail(self, count: int, kwargs: dict) -> tuple:
        """The values of the parameters after the first ``count`` (keywords, then defaults): constant for
        one key, since every keyword argument is part of it."""
        tail = []
        for name in self.names[count:]:
            if name in kwargs:
                tail.append(kwargs[name])
            elif name in self.defaults:
                tail.append(self.defaults[name])
            else:
                raise _Unkeyed
        return tuple(tail)

    # -- the launch ----------------------------------------------------------------------------------
    def launch(self, grid, args: tuple, kwargs: dict):
        """Launch on the current device's current stream (as Triton does)."""
        jit = self.jit
        if not self.enabled or grid.__class__ is not tuple or getattr(jit, "pre_run_hooks", None) or _hooks_active():
            self.triton_calls += 1
            return jit[grid](*args, **kwargs)
        try:
            key = self._key(args, kwargs)
            entry = self.compiled.get(key)
        except (_Unkeyed, TypeError, RuntimeError, AssertionError):
            # not keyed (an unusual argument, an unhashable keyword value), or no usable CUDA device here:
            # Triton's own launch decides (and says why it cannot)
            self.triton_calls += 1
            return jit[grid](*args, **kwargs)
        if entry is None:
            self.triton_calls += 1
            kernel = jit[grid](*args, **kwargs)
            if hasattr(kernel, "result"):  # Triton's asynchronous compile mode
                kernel = kernel.result()
            if len(self.compiled) < MAX_KEYS and _usable(kernel):
                try:
                    self.compiled[key] = _Compiled(kernel, self._tail(len(args), kwargs))
                except _Unkeyed:
                    pass
            return kernel
        self.cached_calls += 1
        size = len(grid)
        # Tensors go to the launcher as they are: it reads their address and asks the driver whether the GPU
        # can reach it, as Triton's own launch does (a CPU tensor is an error there, never a fault).
        if entry.direct is not None:
            entry.direct(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, _current_stream(key[0]),
                         entry.function, entry.cooperative, entry.pdl, None, None, entry.metadata, None, None, None,
                         *args, *entry.tail)
        else:
            entry.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, _current_stream(key[0]),
                      entry.function, entry.metadata, None, None, None, *args, *entry.tail)
        return entry.kernel

    def stats(self) -> dict:
        """Keys kept, and calls served from them or by Triton's own launch (for tests and reports)."""
        return {"keys": len(self.compiled), "cached_calls": self.cached_calls, "triton_calls": self.triton_calls}


def _current_device() -> int:
    """The device Triton launches on (its driver's choice: torch's current device)."""
    return torch.cuda.current_device()


def _current_stream(device: int) -> int:
    """The current stream's raw handle on ``device``, as Triton's own driver reads it."""
    return torch.cuda.current_stream(device).cuda_stream


try:  # the raw accessor Triton's driver uses (CUDA and ROCm builds of torch): no Stream object per call
    from torch._C import _cuda_getCurrentRawStream as _current_stream  # noqa: F811
except ImportError:  # pragma: no cover - a torch without it keeps the public accessor above
    pass


def triton_launch(kernel):
    """The ``triton.jit`` function under this package's wrappers (the launch cache's, the compile budget's;
    itself when unwrapped): Triton's own ``kernel[grid]``, for the dispatch bench's bare-launch row and for
    tools that need the JIT object."""
    while hasattr(kernel, "__dict__"):
        inner = kernel.__dict__.get("jit", kernel.__dict__.get("kernel"))
        if inner is None:
            break
        kernel = inner
    return kernel


def fast_launch_requested() -> bool:
    """``DSAHAL_FAST_LAUNCH`` (default on), by the package's one flag parser."""
    return env_flag(ENV, default=True)


def cache_enabled() -> bool:
    """Whether new wrappers take the cached path: asked for (``DSAHAL_FAST_LAUNCH``) and :func:`supported`."""
    return fast_launch_requested() and supported()


def describe() -> str:
    """How dsahal's Triton kernels launch in this process, and why (for ``dsahal backends -v``). Imports
    nothing: where no kernel module has loaded Triton yet, this Triton's support is checked when one does."""
    if interpreted():
        return "Triton interpreter (TRITON_INTERPRET=1): nothing compiled, no cache"
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if not fast_launch_requested():
        return f"Triton's own kernel[grid](...): {ENV}=0"
    if "triton" in sys.modules and not supported():
        return "Triton's own kernel[grid](...): this Triton keeps its launch hooks outside triton.knobs.runtime"
    return f"launch cache (dsahal.kernel_launch; {ENV}=0 turns it off)"


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_installed: dict[str, LaunchedKernel] = {}


def wrap_launched(namespace: dict) -> None:
    """Replace the launched kernels (module-level ``*_kernel`` Triton functions, by this package's naming)
    of a kernel module's ``namespace`` by :class:`LaunchedKernel` wrappers. Each kernel module calls it on
    its ``globals()`` as its last statement, so its launchers, and modules importing its kernels by name,
    find the wrapper; device helpers stay plain (kernels call them while compiling). Nothing under
    ``TRITON_INTERPRET=1``; with ``DSAHAL_FAST_LAUNCH=0`` the wrappers pass every call to Triton."""
    if interpreted():
        return
    from triton.runtime.jit import JITFunction

    enabled = cache_enabled()
    for name, value in list(namespace.items()):
        if name.endswith("_kernel") and isinstance(value, JITFunction):
            wrapper = LaunchedKernel(value, enabled)
            namespace[name] = wrapper
            _installed[f"{namespace['__name__']}:{name}"] = wrapper


def launched_kernels(module) -> dict[str, Any]:
    """Module-level ``*_kernel`` Triton functions of ``module``, wrapped or not."""
    from triton.runtime.jit import JITFunction

    return {name: value for name, value in vars(module).items()
            if name.endswith("_kernel") and isinstance(value, (JITFunction, LaunchedKernel))}


def installed() -> dict[str, LaunchedKernel]:
    """The wrappers of the kernel modules imported so far, by ``module:name``."""
    return dict(_installed)
