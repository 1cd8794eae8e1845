"""The examples in the watermark authority's docstrings run (pytest's doctest collection
covers ``millwheel/`` and ``docs/`` only)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import watermark_authority

# every module of the package, so a module split off later is covered too
MODULES = ["watermark_authority"] + sorted(
    f"watermark_authority.{m.name}"
    for m in pkgutil.iter_modules(watermark_authority.__path__)
    if m.name != "__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_public_surface_is_pinned():
    assert watermark_authority.__all__ == sorted(watermark_authority.__all__)
    assert set(watermark_authority.__all__) == {
        n
        for n in dir(watermark_authority)
        if not n.startswith("_")
        and n[0].isupper()
        or n in {"embedded_authority", "open_authority", "weighted_percentile"}
    }
