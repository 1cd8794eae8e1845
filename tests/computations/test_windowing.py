"""Windowed aggregations (``computations/windowing.py``, ``computations/columnar_windowing.py``):
``WindowAggregate`` per record and ``ColumnarWindowAggregate`` give the same productions
(values, timestamps, ids) in the harness for every aggregate, tumbling and sliding, with and
without allowed lateness, on batches with disorder, duplicates, late records and records
without a number; and both agree with a plain pandas answer."""

from __future__ import annotations

import inspect
import json
import math
import random
from collections import Counter
from collections.abc import Callable

import pandas as pd
import pytest

from computations.columnar_windowing import ColumnarWindowAggregate
from computations.windowing import AGGREGATES, WindowAggregate, window_starts
from millwheel import ComputationError, ComputationOptions, LatePolicy, Record, Stage
from millwheel.testing import Harness


def events(seed: int, n: int = 500, keys: int = 6) -> list[list[Record]]:
    """Batches shaped like logs: disorder in and across batches, duplicates re-sent later,
    records far behind (late), float and int values, a few without a number."""
    rng = random.Random(seed)
    sent: list[Record] = []
    batches, t = [], 10_000
    for b in range(n // 50):
        batch = []
        for i in range(50):
            ts = t + rng.randrange(-1_500, 3_000) - (8_000 if rng.random() < 0.03 else 0)
            v: object = round(rng.uniform(-5, 50), 3) if rng.random() < 0.7 else rng.randrange(100)
            if rng.random() < 0.01:
                v = "n/a"
            r = Record(
                None,
                {
                    "q": f"k{rng.randrange(keys)}"
                    if rng.random() < 0.9
                    else ("k", rng.randrange(2)),
                    "ms": v,
                },
                ts,
                f"r{b}-{i}",
            )
            batch.append(r)
            sent.append(r)
        batch += [rng.choice(sent) for _ in range(rng.randrange(0, 5))]
        rng.shuffle(batch)
        batches.append(batch)
        t += rng.randrange(500, 2_500)
    return batches


def run(
    cls: type, batches: list[list[Record]], params: dict, late: str, drive: Callable[..., int]
) -> Harness:
    h = Harness.for_computation(
        cls,
        name="Agg",
        inputs={"q": lambda r: r.value["q"]},
        outputs=["window_aggregates"],
        options=ComputationOptions(
            late=LatePolicy.process() if late == "process" else LatePolicy.drop()
        ),
        params=params,
        raise_errors=False,
    )
    drive(h, batches, 0)
    h.finish("q")
    h.run()
    return h


def productions(h: Harness) -> Counter:
    return Counter(
        (r.id, r.timestamp, json.dumps(r.value, sort_keys=True, default=str))
        for r in h.output("window_aggregates")
    )


CASES = [
    {"aggregate": "count"},
    {"aggregate": "sum", "field": "ms"},
    {"aggregate": "mean", "field": "ms", "window_ms": 3_000, "slide_ms": 1_000},
    {
        "aggregate": "min",
        "field": "ms",
        "window_ms": 2_000,
        "slide_ms": 500,
        "allowed_lateness_ms": 4_000,
    },
    {"aggregate": "max", "field": "ms", "window_ms": 2_500, "slide_ms": 1_000},
    {"aggregate": "sum", "field": "ms", "window_ms": 1_000, "allowed_lateness_ms": 10_000},
    {"aggregate": "count", "window_ms": 4_000, "slide_ms": 1_000, "allowed_lateness_ms": 2_000},
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("late", ["drop", "process"])
def test_columnar_aggregate_gives_the_per_record_productions(params, late, drive_windows):
    batches = events(7)
    per_record, columnar = (
        run(WindowAggregate, batches, params, late, drive_windows),
        run(ColumnarWindowAggregate, batches, params, late, drive_windows),
    )
    expected = productions(per_record)
    assert sum(expected.values()) > 50
    assert productions(columnar) == expected
    dead = [(d.id, d.value.reason) for d in per_record.dead_letters()]
    assert dead == [(d.id, d.value.reason) for d in columnar.dead_letters()]
    assert (
        dead
        and all("must be a finite number" in r for _, r in dead)
        or params["aggregate"] == "count"
    )
    a, b = per_record.metrics("Agg"), columnar.metrics("Agg")
    for name in ("records_in", "duplicates", "late", "processed", "productions", "dead_letters"):
        assert a[name] == b[name], name
    if late == "process" and params.get("allowed_lateness_ms"):
        assert any(
            r.value["update"] > 0 for r in columnar.output("window_aggregates")
        )  # late updates happened


@pytest.mark.parametrize("aggregate", AGGREGATES)
@pytest.mark.parametrize("window", [(1_000, None), (3_000, 1_000), (2_000, 700)])
def test_final_aggregates_are_the_pandas_answer(aggregate, window):
    """With records on time (no lateness), the last update of every window is the plain
    batch aggregate of the distinct records in it."""
    w, slide = window
    rng = random.Random(3)
    recs = [
        Record(
            None,
            {"q": f"k{rng.randrange(4)}", "ms": rng.randrange(-50, 500) / 4},
            1_000 + rng.randrange(30_000),
            f"r{i}",
        )
        for i in range(400)
    ]
    params = {"aggregate": aggregate, "field": "ms", "window_ms": w, "slide_ms": slide}
    rows = [
        (r.value["q"], s, r.value["ms"])
        for r in recs
        for s in window_starts(r.timestamp, w, slide or w)
    ]
    df = pd.DataFrame(rows, columns=["key", "start", "v"])
    g = df.groupby(["key", "start"])["v"]
    answer = {"count": g.size(), "sum": g.sum(), "mean": g.mean(), "min": g.min(), "max": g.max()}[
        aggregate
    ].to_dict()
    for cls in (WindowAggregate, ColumnarWindowAggregate):
        h = Harness.for_computation(
            cls, inputs={"q": lambda r: r.value["q"]}, outputs=["window_aggregates"], params=params
        )
        h.inject("q", recs + recs[:20])  # duplicates
        h.finish("q")
        h.run()
        got = {(v["key"], v["window_start"]): v[aggregate] for v in h.values("window_aggregates")}
        assert got.keys() == answer.keys()
        assert all(math.isclose(got[k], answer[k], rel_tol=1e-9, abs_tol=1e-9) for k in answer), cls


def test_a_late_record_updates_its_window_within_the_allowed_lateness_only():
    for cls in (WindowAggregate, ColumnarWindowAggregate):
        h = Harness.for_computation(
            cls,
            inputs={"q": lambda r: r.value["q"]},
            outputs=["window_aggregates"],
            options=ComputationOptions(late=LatePolicy.process()),
            params={
                "aggregate": "sum",
                "field": "ms",
                "window_ms": 1_000,
                "allowed_lateness_ms": 2_000,
            },
        )
        h.inject("q", [h.record({"q": "a", "ms": 1}, 1_100), h.record({"q": "a", "ms": 2}, 2_100)])
        h.advance_watermark("q", 2_500)
        h.run()
        h.inject(
            "q", [h.record({"q": "a", "ms": 10}, 1_200)]
        )  # late, window [1000, 2000) kept until 4000
        h.advance_watermark("q", 3_000)
        h.run()
        h.advance_watermark("q", 4_500)
        h.run()
        h.inject("q", [h.record({"q": "a", "ms": 100}, 1_300)])  # its window was dropped at 4000
        h.finish("q")
        h.run()
        got = [
            (v["window_start"], v["sum"], v["update"], r.timestamp)
            for v, r in zip(
                h.values("window_aggregates"), h.output("window_aggregates"), strict=True
            )
        ]
        assert got == [(1000, 1.0, 0, 2000), (1000, 11.0, 1, 3000), (2000, 2.0, 0, 3000)], cls
        assert h.state(cls.__name__, "a") is None, (
            cls
        )  # every window dropped: the key keeps no state


def test_bad_parameters_are_refused_at_construction():
    for cls in (WindowAggregate, ColumnarWindowAggregate):
        with pytest.raises(ComputationError, match="aggregate must be one of"):
            cls(aggregate="median")
        with pytest.raises(ComputationError, match="needs field"):
            cls(aggregate="sum")
        with pytest.raises(ComputationError, match="slide_ms <= window_ms"):
            cls(window_ms=1_000, slide_ms=2_000)
        with pytest.raises(ComputationError, match="allowed_lateness_ms"):
            cls(allowed_lateness_ms=-1)
        with pytest.raises(ComputationError, match=f"^{cls.__name__}: "):
            cls(aggregate="median")  # the message names the class that was built


def test_both_forms_take_one_constructor_and_a_count_never_decodes_values():
    assert inspect.signature(WindowAggregate) == inspect.signature(ColumnarWindowAggregate)
    assert list(inspect.signature(WindowAggregate).parameters) == [
        "aggregate",
        "field",
        "window_ms",
        "slide_ms",
        "allowed_lateness_ms",
        "output",
    ]
    c = ColumnarWindowAggregate(
        aggregate="mean",
        field="ms",
        window_ms=2_000,
        slide_ms=500,
        allowed_lateness_ms=7,
        output="o",
    )
    assert (c.aggregate, c.field, c.window_ms, c.slide_ms, c.allowed_lateness_ms, c.output) == (
        "mean",
        "ms",
        2_000,
        500,
        7,
        "o",
    )
    assert WindowAggregate(window_ms=3_000).slide_ms == 3_000  # tumbling by default
    assert ColumnarWindowAggregate().record_columns == ("key", "timestamp")
    assert c.record_columns == (
        "key",
        "id",
        "timestamp",
        "value.ms",
    )  # one field, never the whole value


def test_a_record_without_a_number_is_a_dead_letter_and_its_key_goes_on():
    for cls in (WindowAggregate, ColumnarWindowAggregate):
        h = Harness.for_computation(
            cls,
            inputs={"q": lambda r: r.value["q"]},
            outputs=["window_aggregates"],
            params={"aggregate": "sum", "field": "ms"},
            raise_errors=False,
        )
        h.inject(
            "q",
            [
                h.record({"q": "a", "ms": 1}, 1_100, id="x"),
                h.record({"q": "a"}, 1_200, id="y"),
                h.record({"q": "a", "ms": 2.5}, 1_300, id="z"),
            ],
        )
        h.finish("q")
        h.run()
        assert [v["sum"] for v in h.values("window_aggregates")] == [3.5]
        assert [(d.value.stage, d.value.record.id, d.value.reason) for d in h.dead_letters()] == [
            (
                Stage.PROCESS_RECORD,
                "y",
                "ValueError: record 'y': field 'ms' must be a finite number, got NoneType None",
            )
        ]
