"""Fixtures for the Spark runtime tests (the session-wide ``spark`` is in ``tests/conftest.py``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")


def _productions(records, ids: bool = True) -> Counter:
    """Productions by id, timestamp and value; ``ids=False``: by timestamp and value, for a Spark
    run's against the harness's — production ids are each run's own (a key's life is named by
    the batch, or round, that started it: ``millwheel/_identity.py``) — each run's ids checked
    unique instead."""
    records = list(records)
    if ids:
        return Counter((r.id, r.timestamp, json.dumps(r.value, sort_keys=True)) for r in records)
    assert len({r.id for r in records}) == len(records), "a production id given twice"
    return Counter((r.timestamp, json.dumps(r.value, sort_keys=True)) for r in records)


@pytest.fixture
def productions():
    """:func:`_productions`: what two runs' productions are compared by."""
    return _productions
