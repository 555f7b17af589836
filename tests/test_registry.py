"""The registry: discovery, selection by environment, fallbacks, strict mode, allow-list."""
import logging

import pytest
import torch

import dsahal
from dsahal import ops
from dsahal.registry import FallbackError, RegistryError, active_table, registry


def _lse_args(dtype=torch.float32):
    o_parts = torch.randn(3, 4, 2, 8).to(dtype)
    lse_parts = torch.randn(3, 4, 2)
    return o_parts, lse_parts


def test_builtin_backends_are_discovered_through_entry_points():
    records = registry().records
    for name in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert name in records
    assert records["nvidia"].plugin == "nvidia"  # registered by its entry-point name, as a vendor's would be


def test_cpu_machine_selects_reference_automatically():
    assert active_table().name == "reference"


def test_unknown_backend_lists_every_backend_and_why_unavailable(monkeypatch):
    monkeypatch.setenv("DSAHAL_BACKEND", "nope")
    with pytest.raises(RegistryError) as info:
        active_table()
    message = str(info.value)
    assert "unknown backend 'nope'" in message
    for name in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert f"  {name}: " in message
    assert "unavailable (" in message


def test_unavailable_backend_named_in_env_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.unavailable")
    monkeypatch.setenv("DSAHAL_BACKEND", "ghost")
    with pytest.raises(RegistryError, match="backend 'ghost' is not available here: no ghost accelerator found"):
        active_table()


def test_unavailable_high_priority_backend_is_not_selected_automatically(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.unavailable")
    assert active_table().name == "reference"


def test_highest_priority_available_backend_is_selected(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.eager_winner,plugins.half_lse")
    assert active_table().name == "eager"


def test_plugin_that_fails_to_import_is_reported_not_fatal(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.broken_import,plugins.half_lse")
    reg = registry()
    failure = next(f for f in reg.failures if f.plugin == "plugins.broken_import")
    assert failure.stage == "import"
    assert "simulated missing vendor library" in failure.error
    assert "broken_import.py" in failure.error  # traceback summary points at the culprit
    assert reg.records["halflse"].available


def test_an_interrupt_during_plugin_import_is_not_swallowed(monkeypatch):
    # a broken plugin is reported and skipped, but Ctrl-C (or a time limit's SIGINT) must still stop the run
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.interrupted_import")
    with pytest.raises(KeyboardInterrupt):
        registry()


def test_plugin_whose_probe_raises_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.broken_probe")
    record = registry().records["badprobe"]
    assert not record.available
    assert "driver query failed" in record.reason
    assert active_table().name == "reference"


def test_a_plugin_claiming_the_reference_name_is_reported_and_the_builtin_kept(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.duplicate_reference")
    reg = registry()
    assert reg.records["reference"].plugin == "reference"
    assert [(c.backend, c.dropped) for c in reg.conflicts] == [("reference", "plugins.duplicate_reference")]
    assert active_table().name == "reference"


def test_allow_list_limits_loaded_plugins_but_keeps_the_reference(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGINS", "amd")
    reg = registry()
    assert set(reg.records) == {"reference", "amd"}
    assert {"nvidia", "tpu", "ppu"} <= set(reg.excluded)


def test_excluded_plugin_is_named_when_selected(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGINS", "amd")
    monkeypatch.setenv("DSAHAL_BACKEND", "nvidia")
    with pytest.raises(RegistryError, match="plugin nvidia: not loaded"):
        active_table()


def test_plugin_overrides_one_op_and_the_rest_fall_back(monkeypatch):
    import plugins.half_lse as plugin

    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "halflse")
    table = active_table()
    assert table.entries["lse_combine"].status == "native"
    assert table.entries["dsa_attention"].status == "composite"
    fallback = {op for op, e in table.entries.items() if e.status == "fallback"}
    assert fallback == set(ops.OP_NAMES) - {"lse_combine", "dsa_attention"}
    before = plugin.CALLS["lse_combine"]
    with dsahal.observe(dsahal.CallLog()) as log:
        o, lse = ops.lse_combine(*_lse_args())
    assert plugin.CALLS["lse_combine"] == before + 1
    assert [(c.op, c.route, c.fallback) for c in log.calls] == [("lse_combine", "default", False)]


def test_verifier_rejection_falls_back_and_logs_the_reason_once(monkeypatch, caplog):
    import plugins.half_lse as plugin

    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "halflse")
    before = plugin.CALLS["lse_combine"]
    with caplog.at_level(logging.WARNING, logger="dsahal"), dsahal.observe(dsahal.CallLog()) as log:
        for _ in range(3):
            ops.lse_combine(*_lse_args(torch.float16))
    assert plugin.CALLS["lse_combine"] == before  # the verifier kept the plugin out
    messages = [r.getMessage() for r in caplog.records if "lse_combine" in r.getMessage()]
    assert len(messages) == 1
    assert "fp16 partial outputs are not supported" in messages[0]
    assert log.count("lse_combine", fallback=True) == 3 and log.count(fallback=False) == 0
    assert all("fp16 partial outputs are not supported" in c.reason for c in log.calls)


def test_missing_op_fallback_is_logged_once_per_op(monkeypatch, caplog):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "halflse")
    scores = torch.randn(2, 10)
    with caplog.at_level(logging.WARNING, logger="dsahal"):
        ops.topk(scores, torch.tensor([10, 5]), 3)
        ops.topk(scores, torch.tensor([10, 5]), 3)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "dsahal.topk" in m]) == 1
    assert "does not implement topk" in messages[0]


def test_strict_mode_turns_fallback_into_an_error(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "halflse")
    monkeypatch.setenv("DSAHAL_STRICT", "1")
    ops.lse_combine(*_lse_args())  # native: fine
    with pytest.raises(FallbackError, match="does not implement topk"):
        ops.topk(torch.randn(2, 10), torch.tensor([10, 5]), 3)
    with pytest.raises(FallbackError, match="fp16 partial outputs"):
        ops.lse_combine(*_lse_args(torch.float16))


def test_use_backend_switches_and_restores(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    assert active_table().name == "reference"
    with dsahal.use_backend("halflse") as table:
        assert table.name == "halflse"
        assert active_table() is table
    assert active_table().name == "reference"


def test_use_backend_is_local_to_its_thread_and_nests(monkeypatch):
    """A block run on another backend (e.g. a check against the reference) must not redirect the ops
    that other threads of the process run meanwhile; blocks nest and restore in order."""
    import threading

    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    inside, release, seen = threading.Event(), threading.Event(), {}

    def worker():
        with dsahal.use_backend("halflse"):
            seen["worker"] = active_table().name
            inside.set()
            release.wait(5)
        seen["worker after"] = active_table().name

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(5)
    seen["main during"] = active_table().name
    release.set()
    thread.join(5)
    assert seen == {"worker": "halflse", "main during": "reference", "worker after": "reference"}
    with dsahal.use_backend("halflse"):
        with dsahal.use_backend("reference"):
            assert active_table().name == "reference"
        assert active_table().name == "halflse"
    assert active_table().name == "reference"

def test_use_backend_blocks_share_one_table_and_log_a_fallback_once(monkeypatch, caplog):
    """A block entered per call resolves its backend's table once (each resolution walks every op's routes) and
    logs a fallback reason once across blocks; a changed DSAHAL_ROUTES or DSAHAL_STRICT gives a table of its own."""
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    scores = torch.randn(2, 10)
    tables = []
    with caplog.at_level(logging.WARNING, logger="dsahal"):
        for _ in range(3):
            with dsahal.use_backend("halflse") as table:
                tables.append(table)
                ops.topk(scores, torch.tensor([10, 5]), 3)  # halflse has no topk: the reference, logged
    assert tables[0] is tables[1] is tables[2]
    assert len([r for r in caplog.records if "dsahal.topk" in r.getMessage()]) == 1
    with dsahal.use_routes(lse_combine="reference") as forced, dsahal.use_routes(lse_combine="reference") as again:
        assert forced is again and forced.overrides.forced == {"lse_combine": "reference"}
    monkeypatch.setenv("DSAHAL_STRICT", "1")
    with dsahal.use_backend("halflse") as strict:
        assert strict is not tables[0] and strict.strict
        with pytest.raises(FallbackError, match="does not implement topk"):
            ops.topk(scores, torch.tensor([10, 5]), 3)


def test_op_table_is_resolved_once_not_per_call(monkeypatch):
    table = active_table()
    ops.topk(torch.randn(2, 10), torch.tensor([10, 5]), 3)
    assert active_table() is table
    import pluggy

    calls = []
    monkeypatch.setattr(pluggy.PluginManager, "register", lambda *a, **k: calls.append(a))
    ops.topk(torch.randn(2, 10), torch.tensor([10, 5]), 3)
    assert calls == []


def test_backend_declaration_is_validated():
    with pytest.raises(ValueError, match="verifiers for ops it does not implement"):
        dsahal.Backend(name="x", verifiers={"topk": lambda *a: (True, "")})
    with pytest.raises(ValueError, match="non-empty identifier"):
        dsahal.Backend(name="bad name!")


def test_a_use_routes_error_names_use_routes_not_the_variable(monkeypatch):
    monkeypatch.delenv("DSAHAL_ROUTES", raising=False)
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    with pytest.raises(RegistryError, match=r"^use_routes: backend 'reference' has no route 'triton' for sparse_mla"):
        with dsahal.use_routes(sparse_mla="triton"):
            pass
