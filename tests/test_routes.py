"""Routes: ordered per op, first accepting route serves, reference only when all decline; overrides,
observers, strict mode, and routes that are broken in the ways vendor code breaks."""
import logging
import warnings

import pytest
import torch

import dsahal
from dsahal import ops
from dsahal.ops.catalog import COMPOSITE_OPS, OP_NAMES
from dsahal.reference.lse_combine import lse_combine as reference_lse_combine
from dsahal.reference.plugin import reference_backend
from dsahal.registry import (Backend, BackendRecord, FallbackError, OpTable, RegistryError, Route, RouteOverrideError,
                             observe, CallLog)
from dsahal.registry.overrides import parse

SERVED: list[str] = []


def fast(o_parts, lse_parts):
    SERVED.append("fast")
    return reference_lse_combine(o_parts, lse_parts)


def general(o_parts, lse_parts):
    SERVED.append("general")
    return reference_lse_combine(o_parts, lse_parts)


def only_fp32(o_parts, lse_parts):
    return (True, "") if o_parts.dtype == torch.float32 else (False, "needs fp32 partial outputs")


def only_two_parts(o_parts, lse_parts):
    return (True, "") if o_parts.shape[0] == 2 else (False, f"needs W=2, got {o_parts.shape[0]}")


def raising_verifier(o_parts, lse_parts):
    return 1 / 0


def table_of(routes, *, overrides=None, strict=False, name="toy"):
    backend = Backend(name=name, ops={"lse_combine": routes})
    return OpTable(BackendRecord(backend, "tests", True, "test"),
                   BackendRecord(reference_backend(), "reference", True, ""), OP_NAMES, COMPOSITE_OPS,
                   strict=strict, route_overrides=overrides)


def args(w=2, dtype=torch.float32):
    return torch.randn(w, 3, 2, 8, dtype=dtype), torch.randn(w, 3, 2)


@pytest.fixture(autouse=True)
def clear_served():
    SERVED.clear()


def two_routes():
    return [Route("fast", fast, only_two_parts), Route("general", general, only_fp32)]


def test_the_first_route_whose_verifier_accepts_serves_the_call():
    table = table_of(two_routes())
    table.call("lse_combine", *args(w=2))
    table.call("lse_combine", *args(w=3))
    assert SERVED == ["fast", "general"]
    assert table.choose("lse_combine", *args(w=3)) == ("general", [("fast", "needs W=2, got 3")])


def test_the_reference_serves_only_when_every_route_declines_and_the_reasons_are_kept(caplog):
    table = table_of(two_routes())
    with caplog.at_level(logging.WARNING, logger="dsahal"), observe(CallLog()) as log:
        o, lse = table.call("lse_combine", *args(w=3, dtype=torch.float16))
        table.call("lse_combine", *args(w=3, dtype=torch.float16))
    assert SERVED == []
    assert [c.route for c in log.calls] == ["reference", "reference"] and all(c.fallback for c in log.calls)
    assert "fast: needs W=2, got 3" in log.calls[0].reason and "general: needs fp32" in log.calls[0].reason
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "falling back to the reference" in messages[0]  # logged once per reason
    assert o.dtype == torch.float16


def test_strict_mode_turns_a_fallback_into_an_error_naming_every_refusal():
    table = table_of(two_routes(), strict=True)
    with pytest.raises(FallbackError, match="fast: needs W=2, got 3; general: needs fp32"):
        table.call("lse_combine", *args(w=3, dtype=torch.float16))


def test_a_raising_verifier_declines_its_route_and_is_logged_once(caplog):
    table = table_of([Route("broken", fast, raising_verifier), Route("general", general)])
    with caplog.at_level(logging.WARNING, logger="dsahal"):
        for _ in range(3):
            table.call("lse_combine", *args())
    assert SERVED == ["general"] * 3
    route, declined = table.choose("lse_combine", *args())
    assert route == "general" and "ZeroDivisionError" in dict(declined)["broken"]
    raised = [r.getMessage() for r in caplog.records if "ZeroDivisionError" in r.getMessage()]
    assert len(raised) == 1 and "route 'broken'" in raised[0] and "toy" in raised[0]


def test_a_route_that_cannot_be_imported_is_unavailable_with_backend_op_and_path_named():
    table = table_of([Route("missing", "no_such_module_xyz:fn"), Route("general", general)])
    entry = table.entries["lse_combine"]
    missing = entry.routes[0]
    assert not missing.available and "no_such_module_xyz:fn" in missing.reason and "'toy'" in missing.reason \
        and "lse_combine" in missing.reason
    table.call("lse_combine", *args())
    assert SERVED == ["general"]


def test_a_probe_that_says_no_or_raises_makes_its_route_unavailable():
    table = table_of([Route("no", fast, probe=lambda: (False, "library absent")),
                      Route("boom", fast, probe=lambda: 1 / 0), Route("general", general)])
    routes = {r.name: r for r in table.entries["lse_combine"].routes}
    assert routes["no"].reason == "library absent" and "ZeroDivisionError" in routes["boom"].reason
    assert [r.name for r in table.entries["lse_combine"].active] == ["general"]


def test_a_route_whose_signature_cannot_take_the_op_arguments_is_unavailable():
    def three_args(a, b, c):
        return None

    table = table_of([Route("wrong", three_args), Route("general", general)])
    wrong = table.entries["lse_combine"].routes[0]
    assert not wrong.available and "(a, b, c)" in wrong.reason and "(o_parts, lse_parts)" in wrong.reason


def test_a_route_written_against_an_older_argument_order_is_called_by_keyword_with_a_warning():
    def swapped(lse_parts, o_parts):
        SERVED.append("swapped")
        return reference_lse_combine(o_parts, lse_parts)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = table_of([Route("old", swapped)])
    assert any(issubclass(w.category, DeprecationWarning) and "older order" in str(w.message) for w in caught)
    o_parts, lse_parts = args()
    got = table.call("lse_combine", o_parts, lse_parts)
    torch.testing.assert_close(got[0], reference_lse_combine(o_parts, lse_parts)[0])
    assert SERVED == ["swapped"]


def test_forcing_a_route_skips_the_others_and_disabling_one_removes_it():
    forced = table_of(two_routes(), overrides=parse("lse_combine:general"))
    forced.call("lse_combine", *args(w=2))
    disabled = table_of(two_routes(), overrides=parse("lse_combine:-fast"))
    disabled.call("lse_combine", *args(w=2))
    assert SERVED == ["general", "general"]
    reasons = {r.name: r.reason for r in forced.entries["lse_combine"].routes}
    assert "forces lse_combine:general" in reasons["fast"]
    to_reference = table_of(two_routes(), overrides=parse("lse_combine:reference"))
    with observe(CallLog()) as log:
        to_reference.call("lse_combine", *args(w=2))
    assert SERVED == ["general", "general"] and log.calls[0].route == "reference"


def test_unknown_routes_and_ops_in_overrides_are_errors_listing_what_exists():
    with pytest.raises(RegistryError, match="no route 'flash' for lse_combine; its routes are: fast, general, reference"):
        table_of(two_routes(), overrides=parse("lse_combine:flash"))
    with pytest.raises(RegistryError, match="unknown op 'lse_combin'"):
        table_of(two_routes(), overrides=parse("lse_combin:fast"))
    for bad in ("lse_combine", "lse_combine:", ":fast", "lse_combine:-reference"):
        with pytest.raises(RouteOverrideError):
            parse(bad)
    with pytest.raises(RouteOverrideError, match="both forced and disabled"):
        parse("lse_combine:fast,lse_combine:-general")


def test_forcing_an_unavailable_route_is_an_error_saying_why():
    with pytest.raises(RegistryError, match="unavailable: library absent"):
        table_of([Route("no", fast, probe=lambda: (False, "library absent")), Route("general", general)],
                 overrides=parse("lse_combine:no"))


def test_the_environment_and_use_routes_select_routes_on_the_real_registry(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.routed_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "routed")
    import plugins.routed_lse as plugin

    ops.lse_combine(*args(w=2))
    with dsahal.use_routes(lse_combine="general"):
        ops.lse_combine(*args(w=2))
        with dsahal.use_routes("lse_combine:reference"):
            with observe(CallLog()) as log:
                ops.lse_combine(*args(w=2))
    ops.lse_combine(*args(w=2))
    assert plugin.SERVED == ["fast", "general", "fast"] and log.calls[0].route == "reference"
    with pytest.raises(RegistryError, match="its routes are: fast, general, reference"):
        with dsahal.use_routes(lse_combine="nope"):
            pass
    dsahal.registry.reset()
    monkeypatch.setenv("DSAHAL_ROUTES", "lse_combine:general")
    ops.lse_combine(*args(w=2))
    assert plugin.SERVED[-1] == "general"


def test_observers_see_route_args_and_errors_and_run_in_nested_order():
    order = []

    class Recorder(dsahal.OpObserver):
        def __init__(self, name):
            self.name = name

        def before(self, call):
            order.append((self.name, "before", call.op, call.route))

        def after(self, call):
            order.append((self.name, "after", call.op, type(call.error).__name__ if call.error else None))

    def failing(o_parts, lse_parts):
        raise RuntimeError("kernel failed")

    first, second = Recorder("a"), Recorder("b")
    table = table_of([Route("fails", failing)])
    with observe(first), observe(second):
        with pytest.raises(RuntimeError, match="kernel failed"):
            table.call("lse_combine", *args())
    assert order == [("a", "before", "lse_combine", "fails"), ("b", "before", "lse_combine", "fails"),
                     ("b", "after", "lse_combine", "RuntimeError"), ("a", "after", "lse_combine", "RuntimeError")]
    assert dsahal.registry.observers.OBSERVERS == []  # both unregistered on leaving their blocks


def test_an_object_without_hooks_is_refused_as_an_observer():
    with pytest.raises(TypeError, match="before\\(call\\) and after\\(call\\)"):
        dsahal.add_observer(object())


def test_composite_ops_end_with_the_composition_of_the_backend_own_ops():
    table = table_of(two_routes())
    entry = table.entries["dsa_attention"]
    assert entry.status == "composite" and entry.route_names == ("composite",)


def test_route_declarations_are_checked_when_the_backend_is_declared():
    with pytest.raises(ValueError, match="route name twice"):
        Backend(name="dup", ops={"lse_combine": [Route("a", fast), Route("a", general)]})
    with pytest.raises(ValueError, match="reserved"):
        Route("reference", fast)
    with pytest.raises(ValueError, match="list holding str"):
        Backend(name="bad", ops={"lse_combine": ["x:y"]})
    with pytest.raises(ValueError, match="verifiers belong in each Route"):
        Backend(name="bad", ops={"lse_combine": [Route("a", fast)]}, verifiers={"lse_combine": only_fp32})


def test_the_conformance_suite_certifies_one_route_and_its_report_names_it(tmp_path):
    import json
    import os
    import subprocess
    import sys

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    env.update(DSAHAL_PLUGIN_MODULES="plugins.routed_lse", PYTHONPATH=tests_dir)
    reports = {}
    for route in ("fast", "general"):
        out = tmp_path / route
        done = subprocess.run([sys.executable, "-m", "dsahal", "conformance", "--backend", "routed", "--ops",
                               "lse_combine", "--max-examples", "3", "--routes", f"lse_combine:{route}",
                               "--report-dir", str(out)], capture_output=True, text=True, env=env, timeout=600)
        reports[route] = json.loads((out / "conformance.json").read_text())
        served = {name for test in reports[route]["tests"] for name in test["routes"]}
        assert served == {f"lse_combine:{route}"}, (route, served, done.stdout[-2000:])  # forced: only that one
        assert reports[route]["backend"]["route_overrides"] == f"lse_combine:{route}"
    bad = subprocess.run([sys.executable, "-m", "dsahal", "conformance", "--backend", "routed", "--routes",
                          "lse_combine:nope", "--report-dir", str(tmp_path / "bad")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert bad.returncode == 2 and "error:" in bad.stderr and "its routes are: fast, general, reference" in bad.stderr


def test_routes_of_the_selected_backend_do_not_break_a_block_on_another_backend(monkeypatch):
    """DSAHAL_ROUTES names the selected backend's routes; a check on the reference in the same process
    (use_backend) must not fail on them, while the selected backend still rejects a wrong name."""
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.routed_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "routed")
    monkeypatch.setenv("DSAHAL_ROUTES", "lse_combine:general")
    import plugins.routed_lse as plugin

    ops.lse_combine(*args(w=2))
    assert plugin.SERVED[-1] == "general"
    with dsahal.use_backend("reference"):
        with observe(CallLog()) as log:
            ops.lse_combine(*args(w=2))
    assert log.calls[0].backend == "reference"
    dsahal.registry.reset()
    monkeypatch.setenv("DSAHAL_ROUTES", "lse_combine:nope")
    with pytest.raises(RegistryError, match="no route 'nope'"):
        ops.lse_combine(*args(w=2))
