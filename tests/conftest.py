"""Shared test set-up: test-only plugins importable by module path, a fresh registry per test."""
import os
import sys

import pytest
from hypothesis import settings

# CI gates a submission on one reproducible draw (DSAHAL_TEST_DERANDOMIZE=1, set by .ci/run); a developer's
# runs keep drawing fresh examples, which is how new counterexamples are found.
settings.register_profile("derandomized", derandomize=True, database=None)
if os.environ.get("DSAHAL_TEST_DERANDOMIZE", "0") not in ("", "0"):
    settings.load_profile("derandomized")

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

_REGISTRY_ENV = ("DSAHAL_BACKEND", "DSAHAL_PLUGINS", "DSAHAL_STRICT", "DSAHAL_PLUGIN_MODULES", "DSAHAL_ROUTES")


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts from the environment it sets itself, with a registry discovered anew."""
    import dsahal.registry

    for name in _REGISTRY_ENV:
        if name not in os.environ:
            continue
        monkeypatch.delenv(name)
    dsahal.registry.reset()
    _forget_backend_modes()  # at set-up, where the environment is this test's own
    yield
    dsahal.registry.reset()


def _forget_backend_modes():
    """Backends read their mode variables once per registry build (DSAHAL_BATCH_INVARIANT, the AMD path
    status); a test that changed one must not leave its reading to the next test."""
    nvidia_config = sys.modules.get("dsahal.backends.nvidia.config")
    if nvidia_config is not None:
        nvidia_config.read_mode()
    amd_routes = sys.modules.get("dsahal.backends.amd.routes")
    if amd_routes is not None:
        amd_routes.reset()
