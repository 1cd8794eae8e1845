"""The examples in the watermark authority's docstrings run (pytest's doctest collection
covers ``millwheel/`` and ``docs/`` only)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["watermark_authority", "watermark_authority._core", "watermark_authority._journal", "watermark_authority._errors", "watermark_authority._time", "watermark_authority.client", "watermark_authority._server", "watermark_authority.cli"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_public_surface_is_pinned():
    import watermark_authority

    assert watermark_authority.__all__ == sorted(watermark_authority.__all__)
    assert set(watermark_authority.__all__) == {n for n in dir(watermark_authority) if not n.startswith("_") and n[0].isupper() or n in {"embedded_authority", "open_authority", "weighted_percentile"}}
