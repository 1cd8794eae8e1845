"""Fixtures of the computations' tests."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from millwheel import DEAD_LETTER_STREAM
from millwheel.testing import Harness


def _productions(h: Harness, stream: str) -> list[tuple[str, int, str]]:
    return sorted(
        (r.id, r.timestamp, json.dumps(r.value, sort_keys=True, default=str))
        for r in h.output(stream)
    )


def _states(h: Harness, computation: str, keys: Iterable[Any]) -> dict[Any, Any]:
    """Each key's state, a columnar form's ``(key, data)`` row unpickled as its per-record
    form keeps it."""
    out = {}
    for k in keys:
        s = h.state(computation, k)
        if hasattr(s, "columns"):  # a columnar form's rows
            (data,) = s["data"].tolist()
            s = pickle.loads(data)
        if s is not None:
            out[k] = s
    return out


@pytest.fixture(scope="session")
def forms_agree() -> Callable[..., None]:
    """``forms_agree(per_record, columnar, computation, output, keys, counters)``: the two
    harnesses, which ran a computation's per-record and columnar forms on the same input,
    gave the same productions (ids, timestamps, values), dead letters, state of ``keys``
    (per-key state pickled in a ``data`` column on the columnar side) and ``counters``."""

    def check(
        per_record: Harness,
        columnar: Harness,
        computation: str,
        output: str,
        keys: Iterable[Any],
        counters: Iterable[str],
    ) -> None:
        for stream in (output, DEAD_LETTER_STREAM):
            assert _productions(columnar, stream) == _productions(per_record, stream), stream
        keys = list(keys)
        assert _states(columnar, computation, keys) == _states(per_record, computation, keys)
        a, b = per_record.metrics(computation), columnar.metrics(computation)
        for name in counters:
            assert a.get(name) == b.get(name), name

    return check
