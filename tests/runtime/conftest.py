"""Fixtures for the Spark runtime tests: one local Spark session for the whole run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from millwheel.runtime import spark_session

    session = spark_session("local[2]")
    yield session


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")
