"""The plugin path as a vendor engineer walks it (docs/backend-guide.md), and the mistakes vendor code makes
that used to end the process, hang it, pass silently or be reported with a misleading message: each is now
refused or reported naming the plugin, backend, op or route, and never takes the other backends down.
Plugins are small modules in ``tests/plugins/audit_*.py`` loaded through ``DSAHAL_PLUGIN_MODULES``."""
import time

import pytest
import torch

from dsahal import ops
from dsahal.cli import main
from dsahal.cli.new_backend import NewBackendError, generate
from dsahal.ops.catalog import COMPOSITE_OPS, OP_NAMES
from dsahal.reference.lse_combine import lse_combine as reference_lse_combine
from dsahal.reference.plugin import reference_backend
from dsahal.registry import Backend, BackendRecord, OpTable, Route, registry, set_backend, table as table_module

SERVED: list[str] = []


def plugins(monkeypatch, *modules):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", ",".join(f"plugins.{m}" for m in modules))


def kernel(o_parts, lse_parts):
    SERVED.append("kernel")
    return reference_lse_combine(o_parts, lse_parts)


def table_of(routes):
    backend = Backend(name="toy", ops={"lse_combine": routes})
    return OpTable(BackendRecord(backend, "tests", True, "test"),
                   BackendRecord(reference_backend(), "reference", True, ""), OP_NAMES, COMPOSITE_OPS, strict=False)


def lse_args():
    return torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2)


# ---------------------------------------------------------------------------- dsahal new-backend

def test_new_backend_into_a_path_under_a_file_is_one_error_line_not_a_traceback(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["new-backend", "acme", "--dir", str(tmp_path / "afile" / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "argument '--dir'" in err and "Not a directory" in err
    assert main(["new-backend", "acme", "--dir", str(tmp_path / "afile")]) == 2
    assert "which is a file" in capsys.readouterr().err  # not "which is not empty"


def test_new_backend_refuses_a_name_whose_package_an_installed_backend_already_has(tmp_path):
    # acme-x and acme_x both become dsahal_acme_x / dsahal-acme-x: installing one would replace the other
    with pytest.raises(NewBackendError, match=r"package dsahal_acme_x is the one of backend 'acme-x'"):
        generate("acme_x", tmp_path / "out", taken=frozenset({"reference", "acme-x"}))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- verifier and probe answers

@pytest.mark.parametrize("answer", [True, None, "no", (True, "", 3)], ids=["bool", "none", "str", "triple"])
def test_a_verifier_answering_anything_but_ok_reason_declines_saying_what_it_returned(answer, caplog):
    SERVED.clear()
    table = table_of([Route("kernel", kernel, lambda o_parts, lse_parts: answer)])
    table.call("lse_combine", *lse_args())  # the hot path: "no" and (True, "", 3) used to be taken as a yes
    assert SERVED == []
    why = f"verifier returned {answer!r}, expected (ok, reason)"
    assert why in table.explain("lse_combine", *lse_args())  # was "verifier raised TypeError: cannot unpack..."
    assert any(why in r.getMessage() and "route 'kernel'" in r.getMessage() for r in caplog.records)


def test_a_verifier_declining_without_a_reason_says_so():
    table = table_of([Route("kernel", kernel, lambda o_parts, lse_parts: (False, None))])
    assert table.explain("lse_combine", *lse_args()).endswith("(kernel: declined (no reason given))")


def test_a_route_probe_answering_a_bare_bool_is_off_saying_what_it_returned():
    table = table_of([Route("kernel", kernel, probe=lambda: True)])
    (route,) = table.entries["lse_combine"].routes
    assert not route.available and route.reason == "probe returned True, expected (ok, reason)"


def test_a_hung_route_probe_is_bounded_and_the_next_route_serves(monkeypatch):
    monkeypatch.setattr(table_module, "ROUTE_PROBE_TIMEOUT_S", 0.5)
    plugins(monkeypatch, "audit_hung_route_probe")
    start = time.monotonic()
    set_backend("hungroute")  # used to block for the whole probe (forever for a hung driver query)
    assert time.monotonic() - start < 3.0
    entry = set_backend("hungroute").entries["lse_combine"]
    vendor, torch_route = entry.routes
    assert not vendor.available and "did not answer within 0.5 s" in vendor.reason
    assert "ROUTE_PROBE_TIMEOUT_S" in vendor.reason and entry.active == (torch_route,)


def test_sys_exit_in_a_route_import_or_probe_turns_the_route_off_not_the_process(monkeypatch, capsys):
    plugins(monkeypatch, "audit_exiting_routes", "half_lse")
    table = set_backend("exiting")  # used to end the process with SystemExit
    lse, topk = table.entries["lse_combine"], table.entries["topk"]
    assert lse.status == "fallback" and "plugins.audit_exits_on_import:lse_combine" in lse.reason
    assert "SystemExit: libacme_kernels.so not found" in lse.reason and "'exiting'" in lse.reason
    assert topk.status == "fallback" and "probe raised SystemExit: 3" in topk.reason
    o, _ = ops.lse_combine(*lse_args())  # served by the reference
    assert o.shape == (3, 2, 8)
    assert main(["backends", "--verbose"]) == 0  # used to exit silently, listing nothing
    out = capsys.readouterr().out
    assert "halflse" in out and "reference" in out and "SystemExit: libacme_kernels.so not found" in out


# ---------------------------------------------------------------------------- declarations

def test_a_hook_returning_one_backend_instead_of_a_list_is_named(monkeypatch):
    plugins(monkeypatch, "audit_single_backend", "half_lse")
    reg = registry()
    failure = next(f for f in reg.failures if f.plugin == "plugins.audit_single_backend")
    assert failure.error == ("its dsahal_backends returned Backend, expected a list of dsahal.Backend "
                             "(return [backend])")  # was "TypeError: 'Backend' object is not iterable"
    assert reg.records["halflse"].available


def test_a_dotted_path_is_refused_when_declared_naming_backend_op_and_the_plugin_line(monkeypatch):
    plugins(monkeypatch, "audit_dotted_path", "half_lse")
    reg = registry()
    assert "dotted" not in reg.records  # was registered, its op quietly on the reference once selected
    failure = next(f for f in reg.failures if f.plugin == "plugins.audit_dotted_path")
    assert "backend 'dotted': op 'lse_combine'" in failure.error
    assert "'plugins.half_lse.lse_combine' expected a callable or a 'package.module:attribute' string" \
        in failure.error
    assert "audit_dotted_path.py:" in failure.error  # the vendor's line, not dsahal's validation
    assert reg.records["halflse"].available


def test_an_op_declared_as_neither_implementation_nor_routes_names_backend_and_op():
    with pytest.raises(ValueError, match="backend 'x': op 'topk' expected an implementation .* got int"):
        Backend(name="x", ops={"topk": 42})  # was "TypeError: 'int' object is not iterable"
    with pytest.raises(ValueError, match="Route 'r': implementation expected a callable .* got int"):
        Route("r", 42)
    with pytest.raises(ValueError, match="Route 'r': probe 'acme.probe' expected a callable"):
        Route("r", kernel, probe="acme.probe")


# ---------------------------------------------------------------------------- the conformance suite

def test_the_suite_names_an_output_on_the_wrong_device():
    from dsahal.conformance import assertions

    class Run:
        device = torch.device("cpu")

        def fail(self, detail):
            raise AssertionError(detail)

    with pytest.raises(AssertionError, match="'o' expected on the inputs' device 'cpu', got a tensor on 'meta'"):
        assertions.assert_shape_dtype(Run(), "o", torch.empty(3, 2, device="meta"), (3, 2), torch.float32)


def test_a_top_k_is_expected_where_its_scores_are_not_on_the_runs_device():
    """The distributed properties build their cases on the CPU (gloo ranks compute there) while the run's
    device is the GPU: the H200 run of 2026-12-02 failed every topk_merge example on 'got a tensor on cpu'
    until the expected device became the scores' own."""
    from dsahal.conformance import assertions

    class Run:
        device = torch.device("cuda")

        def fail(self, detail):
            raise AssertionError(detail)

    scores = torch.tensor([[3.0, 1.0, 2.0]])
    lengths = torch.tensor([3], dtype=torch.int32)
    got = torch.tensor([[0, 2]], dtype=torch.int32)
    assertions.assert_topk_rows(Run(), got, scores, lengths, 2, got.clone(), exact_set=True)
    with pytest.raises(AssertionError, match="expected on the inputs' device 'cpu', got a tensor on 'meta'"):
        assertions.assert_topk_rows(Run(), torch.empty(1, 2, dtype=torch.int32, device="meta"), scores, lengths, 2,
                                    got, exact_set=True)
