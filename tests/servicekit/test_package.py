"""servicekit as a package: the base layer imports no service and no user API; its docstring
examples run; its public surface is pinned."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest

MODULES = [
    "servicekit",
    "servicekit.checks",
    "servicekit.errors",
    "servicekit.secret",
    "servicekit.http",
    "servicekit.service",
    "servicekit.client",
    "servicekit.cli",
    "servicekit.testing",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_it_imports_neither_millwheel_nor_any_service():
    code = "import sys, servicekit, servicekit.service, servicekit.client, servicekit.cli, servicekit.http; print(sorted(m for m in sys.modules if m.split('.')[0] in ('millwheel', 'watermark_authority', 'id_registry', 'starlette')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert (
        out.strip() != ""
        and "millwheel" not in out
        and "watermark_authority" not in out
        and "id_registry" not in out
    )
    bare = subprocess.run(
        [sys.executable, "-c", code.replace(", servicekit.http", "")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert bare.strip() == "[]", "importing servicekit alone should not load a web framework"


def test_the_public_surface_is_pinned():
    import servicekit

    assert servicekit.__all__ == sorted(servicekit.__all__, key=lambda n: (not n.isupper(), n))
    exported = {
        n
        for n in dir(servicekit)
        if not n.startswith(("_", "@"))
        and n
        not in {
            "annotations",
            "checks",
            "errors",
            "secret",
            "http",
            "service",
            "client",
            "cli",
            "testing",
            "ports",
        }
    }
    assert set(servicekit.__all__) == exported
