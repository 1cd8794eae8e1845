"""The registry is a separate service: it loads nothing of the user API (``millwheel``), and the
examples in its docstrings run (pytest's doctest collection covers ``millwheel/`` and ``docs/``)."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest

import id_registry

MODULES = [
    "id_registry",
    "id_registry._model",
    "id_registry._core",
    "id_registry._backend",
    "id_registry._etcd",
    "id_registry._worker",
    "id_registry._errors",
    "id_registry._server",
    "id_registry._requests",
    "id_registry._service",
    "id_registry.client",
    "id_registry.cli",
    "id_registry.testing",
]


def test_the_service_and_its_clients_import_no_millwheel():
    code = f"import sys; {'; '.join(f'import {m}' for m in MODULES)}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('millwheel', 'watermark_authority')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_client_side_loads_no_web_framework():
    code = "import sys, id_registry; print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_public_surface_is_pinned():
    assert id_registry.__all__ == sorted(id_registry.__all__)
    assert set(id_registry.__all__) == {
        n
        for n in dir(id_registry)
        if not n.startswith("_")
        and (n[0].isupper() or n in {"embedded_registry", "open_registry", "start_registry"})
    }
