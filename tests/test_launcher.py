"""The launch cache (:mod:`dsahal.kernel_launch`): which calls reuse a compiled kernel,
which go through Triton's own launch, and the arguments a cached launch hands the compiled kernel.

No GPU here: Triton's launch is replaced by a recorder that returns a stand-in compiled kernel (the wrapper
only needs its ``run``, ``function`` and ``packed_metadata``). The real launch path is exercised on the H200
by every Triton route (the conformance suite) and timed by ``python -m dsahal.bench.dispatch``."""
import pytest
import torch
import triton
import triton.language as tl

from dsahal import kernel_launch as launcher
from dsahal.kernel_launch import LaunchedKernel, triton_launch


@triton.jit(do_not_specialize=("n",))
def copy_kernel(src, dst, stride, n, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs * stride, tl.load(src + offs * stride, mask=offs < n) * scale, mask=offs < n)


class CompiledStandIn:
    def __init__(self, number):
        self.number = number
        self.function = 1000 + number
        self.packed_metadata = (4, 1, 0)
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


class TritonStandIn:
    """Triton's own ``kernel[grid](...)``: records the call, returns a new compiled stand-in per call (so a
    test can tell which compile a cached launch reuses)."""

    def __init__(self, jit):
        self.jit = jit
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return CompiledStandIn(len(self.calls))

        return launch


@pytest.fixture
def wrapped(monkeypatch):
    wrapper = LaunchedKernel(copy_kernel)
    stand_in = TritonStandIn(copy_kernel)
    wrapper.__dict__["jit"] = stand_in
    stand_in.pre_run_hooks = []
    monkeypatch.setattr(launcher, "_current_device", lambda: 0)
    monkeypatch.setattr(launcher, "_current_stream", lambda device: 77)
    monkeypatch.setattr(launcher, "_hooks_active", lambda: False)
    return wrapper, stand_in


def test_parameters_are_read_from_the_jit_function():
    wrapper = LaunchedKernel(copy_kernel)
    assert wrapper.names == ["src", "dst", "stride", "n", "scale", "BLOCK", "EVEN"]
    assert wrapper.kinds == [launcher._SPECIALISED] * 3 + [launcher._UNSPECIALISED, launcher._SPECIALISED] + \
        [launcher._CONSTEXPR] * 2
    assert wrapper.defaults == {"EVEN": False}
    assert wrapper.fn is copy_kernel.fn and triton_launch(wrapper) is copy_kernel  # attributes pass through


def test_a_repeated_call_reuses_the_compiled_kernel_with_every_parameter_in_order(wrapped):
    wrapper, triton_own = wrapped
    src, dst = torch.randn(64), torch.empty(64)
    first = wrapper[(3, 2)](src, dst, 16, 40, 0.5, BLOCK=64, num_warps=4)
    assert len(triton_own.calls) == 1 and first.runs == []
    again = wrapper[(5,)](src, dst, 16, 41, 0.25, BLOCK=64, num_warps=4)  # n unspecialised, scale a run-time float
    assert again is first and len(triton_own.calls) == 1
    (args,) = first.runs
    # grid, stream, function, metadata, no launch metadata or hooks, every parameter in order (the default
    # last); tensors as they are (the launcher reads their address and asks the driver whether it is reachable)
    assert args[:9] == (5, 1, 1, 77, first.function, first.packed_metadata, None, None, None)
    assert args[9] is src and args[10] is dst and args[11:] == (16, 41, 0.25, 64, False)
    assert wrapper.stats() == {"keys": 1, "cached_calls": 1, "triton_calls": 1}


@pytest.mark.parametrize("change", ["misaligned", "dtype", "stride_one", "stride_odd", "wide_int", "constexpr",
                                    "option", "default_given", "device"])
def test_every_fact_triton_specialises_on_is_in_the_key(wrapped, monkeypatch, change):
    wrapper, triton_own = wrapped
    src, dst = torch.randn(64), torch.empty(64)
    base = dict(src=src, dst=dst, stride=16, n=40, scale=0.5)
    options = dict(BLOCK=64, num_warps=4)
    wrapper[(1,)](*base.values(), **options)
    if change == "misaligned":
        base["src"] = src[1:]  # 4 bytes off a 16-byte boundary
    elif change == "dtype":
        base["dst"] = dst.double()
    elif change == "stride_one":
        base["stride"] = 1
    elif change == "stride_odd":
        base["stride"] = 5
    elif change == "wide_int":
        base["n"] = 1 << 33  # unspecialised, but int64 instead of int32
    elif change == "constexpr":
        options["BLOCK"] = 32
    elif change == "option":
        options["num_warps"] = 8
    elif change == "default_given":
        options["EVEN"] = True
    elif change == "device":
        monkeypatch.setattr(launcher, "_current_device", lambda: 1)
    wrapper[(1,)](*base.values(), **options)
    assert len(triton_own.calls) == 2, change
    wrapper[(1,)](*base.values(), **options)  # and that new key is kept
    assert len(triton_own.calls) == 2 and wrapper.stats()["keys"] == 2


def test_unkeyed_calls_take_tritons_launch_every_time(wrapped, monkeypatch):
    wrapper, triton_own = wrapped
    src, dst = torch.randn(64), torch.empty(64)
    wrapper[lambda meta: (1,)](src, dst, 16, 4, 0.5, BLOCK=64)  # a callable grid
    wrapper[lambda meta: (1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    wrapper[(1,)](src, dst, 16, 4, 0.5, [1], BLOCK=64)  # an argument of another type: not keyed (Triton decides)
    wrapper[(1,)](src, dst, 16, n=4, scale=0.5, BLOCK=64)  # run-time arguments by keyword
    wrapper[(1,)](src, dst, 16, n=4, scale=0.5, BLOCK=64)
    assert len(triton_own.calls) == 5 and wrapper.stats()["keys"] == 0
    monkeypatch.setattr(launcher, "_hooks_active", lambda: True)  # a profiler's launch hook
    wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    assert len(triton_own.calls) == 7
    monkeypatch.setattr(launcher, "_hooks_active", lambda: False)
    triton_own.pre_run_hooks = [lambda *a, **k: None]
    wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    assert len(triton_own.calls) == 9 and wrapper.stats()["cached_calls"] == 0


def test_disabled_or_without_a_device_every_call_is_tritons(wrapped, monkeypatch):
    wrapper, triton_own = wrapped
    src, dst = torch.randn(64), torch.empty(64)
    wrapper.enabled = False
    for _ in range(2):
        wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    wrapper.enabled = True

    def no_cuda():
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(launcher, "_current_device", no_cuda)
    for _ in range(2):
        wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    assert len(triton_own.calls) == 4 and wrapper.stats()["keys"] == 0


def test_the_cache_is_bounded_per_kernel(wrapped, monkeypatch):
    wrapper, triton_own = wrapped
    monkeypatch.setattr(launcher, "MAX_KEYS", 3)
    src, dst = torch.randn(64), torch.empty(64)
    for block in (16, 32, 64, 128, 128):
        wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=block)
    assert wrapper.stats() == {"keys": 3, "cached_calls": 0, "triton_calls": 5}


def test_a_compiled_kernel_without_the_launch_interface_is_never_cached(wrapped):
    wrapper, triton_own = wrapped

    class Other:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: object()  # e.g. another Triton's return value

    other = Other()
    other.pre_run_hooks = []
    wrapper.__dict__["jit"] = other
    src, dst = torch.randn(64), torch.empty(64)
    for _ in range(2):
        wrapper[(1,)](src, dst, 16, 4, 0.5, BLOCK=64)
    assert wrapper.stats() == {"keys": 0, "cached_calls": 0, "triton_calls": 2}


def test_kernel_modules_wrap_their_launched_kernels_at_import():
    """Each kernel module's last statement wraps its ``*_kernel`` functions (the pytest process has no
    ``TRITON_INTERPRET``); device helpers stay plain, since kernels call them while compiling; modules
    that import a kernel by name get the wrapper."""
    from triton.runtime.jit import JITFunction

    from dsahal.backends.triton_kernels import indexer, lse_combine, topk_bound, topk_groups
    from dsahal.backends.triton_kernels.compile_budget import BudgetedKernel

    def launched(kernel):  # under a compile budget an earlier test of this process may have installed
        return kernel.kernel if isinstance(kernel, BudgetedKernel) else kernel

    wrapper = launched(lse_combine.lse_combine_kernel)
    assert isinstance(wrapper, LaunchedKernel)
    assert isinstance(triton_launch(wrapper), JITFunction)
    assert isinstance(indexer._score_tile, JITFunction)
    assert launched(topk_groups.bound_finish_kernel) is launched(topk_bound.bound_finish_kernel)
    assert launcher.installed()[f"{lse_combine.__name__}:lse_combine_kernel"] is wrapper
    # the model's fused kernels and the KDA state gather/scatter: every Triton kernel dsahal launches
    from dsahal.backends.nvidia import kda_state_rows
    from dsahal.model import fused

    assert isinstance(fused._rms_norm_kernel, LaunchedKernel)
    assert isinstance(kda_state_rows._scatter_kernel, LaunchedKernel)


def test_wrap_launched_does_nothing_under_the_interpreter_and_honours_the_switch(monkeypatch):
    namespace = {"__name__": "example", "copy_kernel": copy_kernel, "helper": copy_kernel}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launcher.wrap_launched(namespace)
    assert namespace["copy_kernel"] is copy_kernel
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv(launcher.ENV, "0")
    try:
        launcher.wrap_launched(namespace)
        wrapper = namespace["copy_kernel"]
        assert isinstance(wrapper, LaunchedKernel) and not wrapper.enabled and namespace["helper"] is copy_kernel
    finally:
        launcher._installed.pop("example:copy_kernel", None)


def test_the_environment_switch_is_read_by_the_packages_flag_parser(monkeypatch):
    monkeypatch.delenv(launcher.ENV, raising=False)
    assert launcher.fast_launch_requested()
    for text, expected in (("0", False), ("off", False), ("1", True), ("yes", True)):
        monkeypatch.setenv(launcher.ENV, text)
        assert launcher.fast_launch_requested() is expected
    monkeypatch.setenv(launcher.ENV, "maybe")
    with pytest.raises(ValueError, match=launcher.ENV):
        launcher.fast_launch_requested()


def test_a_triton_without_the_hook_slots_keeps_tritons_own_launch(monkeypatch):
    """Another Triton (launch hooks not in ``triton.knobs.runtime``): new wrappers pass every call through."""
    monkeypatch.setattr(launcher, "_HOOKS", None)
    monkeypatch.setattr(launcher, "_launch_hooks", lambda: None)
    monkeypatch.delenv(launcher.ENV, raising=False)
    assert not launcher.supported() and not launcher.cache_enabled()
    namespace = {"__name__": "example2", "copy_kernel": copy_kernel}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    try:
        launcher.wrap_launched(namespace)
        assert not namespace["copy_kernel"].enabled
    finally:
        launcher._installed.pop("example2:copy_kernel", None)
    assert launcher._hooks_active()  # so a wrapper enabled by hand still takes Triton's launch


def test_dsahal_backends_says_how_kernels_launch(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(launcher.ENV, raising=False)
    assert launcher.describe().startswith("launch cache")
    monkeypatch.setenv(launcher.ENV, "0")
    assert launcher.describe() == "Triton's own kernel[grid](...): DSAHAL_FAST_LAUNCH=0"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert launcher.describe().startswith("Triton interpreter")
    from dsahal.backends.nvidia.plugin import versions

    monkeypatch.delenv("TRITON_INTERPRET")
    assert versions()["path triton launch"].endswith("DSAHAL_FAST_LAUNCH=0")
