"""Maps the three source folders onto one import name.

`core/` is `dsahal`, `backends/` is `dsahal.backends`, `conformance/` is
`dsahal.conformance`. Sub-packages are discovered so new folders need no edit here.
"""
import os

from setuptools import setup

ROOTS = {"dsahal": "core", "dsahal.backends": "backends", "dsahal.conformance": "conformance"}


def _packages():
    found = []
    for package, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, folder)
                found.append(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    return found


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"dsahal.conformance": ["templates/*", "*.md"], "dsahal": ["presets/*.json", "templates/**/*"]},
    include_package_data=True,
)
