"""`dsahal new-backend NAME [--dir D]`: what it generates and what it refuses."""
import ast
import os
import tomllib

import pytest

from dsahal.cli import main
from dsahal.cli.new_backend import BUILTIN_BACKENDS, NewBackendError, check_name, generate

EXPECTED_FILES = {
    "pyproject.toml", "README.md", "skips.txt", ".github/workflows/conformance.yml",
    "src/dsahal_acme/__init__.py", "src/dsahal_acme/plugin.py", "src/dsahal_acme/lse_combine.py",
    "tests/test_lse_combine.py",
}


@pytest.fixture
def acme(tmp_path):
    target = tmp_path / "dsahal-acme"
    written = generate("acme", target, tags=["gpu", "acme"], runner_labels=["self-hosted", "acme-x1"])
    return target, written


def _files(root):
    return {os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for d, _, fs in os.walk(root) for f in fs}


def test_generates_the_complete_package_and_nothing_else(acme):
    target, written = acme
    assert _files(target) == EXPECTED_FILES
    assert {p.relative_to(target).as_posix() for p in written} == EXPECTED_FILES


def test_every_placeholder_is_filled(acme):
    target, _ = acme
    for name in EXPECTED_FILES:
        text = (target / name).read_text()
        # GitHub's own expressions are `${{ ... }}`; a bare `{{` would be a template left unfilled.
        assert "{{" not in text.replace("${{", ""), name
        assert "PACKAGE" not in text, name


def test_pyproject_declares_the_entry_point_dsahal_discovers(acme):
    target, _ = acme
    project = tomllib.loads((target / "pyproject.toml").read_text())
    assert project["project"]["name"] == "dsahal-acme"
    assert project["project"]["entry-points"]["dsahal.backends"] == {"acme": "dsahal_acme.plugin"}


def test_python_files_parse_and_the_backend_declares_probe_tags_op_and_verifier(acme):
    target, _ = acme
    for name in EXPECTED_FILES:
        if name.endswith(".py"):
            ast.parse((target / name).read_text(), filename=name)
    plugin = (target / "src/dsahal_acme/plugin.py").read_text()
    assert 'tags=frozenset({"acme", "gpu"})' in plugin
    assert 'Route("torch", "dsahal_acme.lse_combine:lse_combine", "dsahal_acme.lse_combine:verify_lse_combine"' \
        in plugin
    assert "probe=probe" in plugin
    assert "priority=-1," in plugin  # never the automatic backend just by being installed


def test_workflow_runs_the_suite_on_the_self_hosted_runner_and_publishes_reports(acme):
    target, _ = acme
    workflow = (target / ".github/workflows/conformance.yml").read_text()
    assert "runs-on: [self-hosted, acme-x1]" in workflow
    assert "dsahal conformance --backend acme --skips skips.txt" in workflow
    assert "GITHUB_STEP_SUMMARY" in workflow and "actions/upload-artifact" in workflow


def test_skip_file_starts_with_no_active_entry(acme):
    target, _ = acme
    lines = [line.strip() for line in (target / "skips.txt").read_text().splitlines()]
    assert all(not line or line.startswith("#") for line in lines)


@pytest.mark.parametrize("name", ["", "Acme", "1acme", "acme!", "a" * 41, "acme-", "ac me"])
def test_bad_names_are_refused_with_the_rule(name):
    with pytest.raises(NewBackendError, match="argument 'NAME' expected lower-case letters"):
        check_name(name)


@pytest.mark.parametrize("name", sorted(BUILTIN_BACKENDS))
def test_names_of_existing_backends_are_refused(name):
    with pytest.raises(NewBackendError, match="a name no installed backend uses"):
        check_name(name)


def test_a_non_empty_directory_is_never_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(NewBackendError, match="expected a new or empty directory"):
        generate("acme", tmp_path)
    assert _files(tmp_path) == {"keep.txt"}


def test_cli_generates_into_dir_and_prints_the_next_commands(tmp_path, capsys):
    assert main(["new-backend", "acme-2", "--dir", str(tmp_path / "out"), "--tag", "npu,acme"]) == 0
    out = capsys.readouterr().out
    assert "wrote 8 files" in out and "dsahal conformance --backend acme-2" in out
    assert (tmp_path / "out" / "src" / "dsahal_acme_2" / "plugin.py").is_file()


def test_cli_refuses_a_name_an_installed_plugin_already_uses(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "plugins.half_lse")
    from dsahal.registry import registry

    taken = next(name for name in registry().records if name not in BUILTIN_BACKENDS)
    assert main(["new-backend", taken, "--dir", str(tmp_path / "x")]) == 2
    assert "a name no installed backend uses" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
