"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Spark workers must run this interpreter (the project's venv), never a system python.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# `millwheel run` serves the Spark UI by default; tests (and their subprocesses) do not
os.environ.setdefault("MILLWHEEL_SPARK_UI", "0")

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def make_record():
    """Build records with unique ids: ``make_record(value, ts, key=None, id=None)``."""
    from millwheel import Record

    counter = iter(range(1, 10**9))

    def make(value, timestamp, key=None, id=None):
        return Record(key, value, timestamp, id if id is not None else f"r{next(counter)}")

    return make
