"""Maps the three source folders onto one import name.

`core/` is `dsahal`, `backends/` is `dsahal.backends`, `conformance/` is
`dsahal.conformance`. Sub-packages are discovered so new folders need no edit here.

Data folders (presets, the `new-backend` templates, the conformance CI template) hold no
`__init__.py` but Python would still import them as namespace packages, so setuptools wants them
declared as packages of their own: each folder under DATA_FOLDERS is listed in `packages` with all
its files as package data. A sub-folder whose name is not an identifier (`dot-github`) cannot be a
package; its files ship as data of the nearest package above it.
"""
import os

from setuptools import setup

ROOTS = {"dsahal": "core", "dsahal.backends": "backends", "dsahal.conformance": "conformance"}
DATA_FOLDERS = {"dsahal": ("presets", "templates"), "dsahal.conformance": ("templates",),
                "dsahal.backends": ("nvidia/fla_configs",)}
SKIP = (".", "__")  # hidden folders, __pycache__


def _code_packages():
    found = []
    for package, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith(SKIP)]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, folder)
                found.append(package if rel == "." else package + "." + rel.replace(os.sep, "."))
    return found


def _data_packages():
    """{package: [file globs]} for every folder under DATA_FOLDERS."""
    data = {}
    for root_package, folders in DATA_FOLDERS.items():
        root_folder = ROOTS[root_package]
        for top in folders:
            for dirpath, dirnames, filenames in os.walk(os.path.join(root_folder, top)):
                dirnames[:] = [d for d in dirnames if not d.startswith(SKIP)]
                rel = os.path.relpath(dirpath, root_folder).split(os.sep)
                # the deepest ancestor (or itself) whose every part is an identifier owns the files
                depth = next((i for i, part in enumerate(rel) if not part.isidentifier()), len(rel))
                package = ".".join([root_package, *rel[:depth]])
                if filenames:
                    prefix = "/".join(rel[depth:])
                    data.setdefault(package, []).append(f"{prefix}/*" if prefix else "*")
                elif depth == len(rel):
                    data.setdefault(package, [])
    return data


DATA = _data_packages()

setup(
    packages=_code_packages() + sorted(DATA),
    package_dir=ROOTS,
    package_data={"dsahal.conformance": ["*.md"], **DATA},
)
