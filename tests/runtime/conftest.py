"""Fixtures for the Spark runtime tests (the session-wide ``spark`` is in ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")
