"""Shared test set-up: test-only plugins importable by module path, a fresh registry per test."""
import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

_REGISTRY_ENV = ("DSAHAL_BACKEND", "DSAHAL_PLUGINS", "DSAHAL_STRICT", "DSAHAL_PLUGIN_MODULES")


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts from the environment it sets itself, with a registry discovered anew."""
    import dsahal.registry

    for name in _REGISTRY_ENV:
        if name not in os.environ:
            continue
        monkeypatch.delenv(name)
    dsahal.registry.reset()
    yield
    dsahal.registry.reset()
