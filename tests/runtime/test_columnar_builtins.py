"""Differential test of the columnar windowed aggregation (``computations/columnar_windowing.py``):
the harness per record, the harness columnar, local Spark columnar and a plain pandas
answer, on log files shaped like real ones.

The logs: three files named by their time and one whose name carries none (a back-fill),
records out of order inside and across files (within the declared ``lateness_ms``),
duplicates re-sent in later files, a record behind its file (late: dropped), a malformed
line and a record without a number (a dead letter). ``ColumnarWindowAggregate`` (a
sliding mean) must give ``WindowAggregate``'s productions — ids included in the harness;
on Spark the ids are the run's own (``millwheel/_identity.py``) — and dead letters on
both backends, and its aggregates must be the pandas answer over the distinct,
on-time, well-formed lines. (Photon's joiner: ``tests/topologies/photon/test_spark.py``
and ``test_columnar.py``; Zeitgeist's counter: ``tests/topologies/zeitgeist``.)
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pandas as pd
import pytest

from computations.columnar_windowing import ColumnarWindowAggregate
from computations.windowing import WindowAggregate, window_starts
from millwheel import ComputationOptions, LatePolicy, LogFileSource, Stage, Topology
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.testing import Harness

pytestmark = pytest.mark.spark

T0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z
LATENESS = 3_000
PARAMS = {"aggregate": "mean", "field": "ms", "window_ms": 3_000, "slide_ms": 1_000}


def write_logs(d) -> pd.DataFrame:
    """The log files; returns the distinct, on-time, well-formed records the answer is made of."""
    d.mkdir()
    rng = random.Random(27)
    kept: list[dict] = []
    sent: list[dict] = []
    for f, name in enumerate(
        [
            "queries-2026-01-01T10-00-00.jsonl",
            "queries-2026-01-01T10-00-20.jsonl",
            "queries-2026-01-01T10-00-40.jsonl",
            "backfill.jsonl",
        ]
    ):
        start = T0 + min(f, 2) * 20_000
        rows = [
            {
                "id": f"f{f}-{i}",
                "ts": start + rng.randrange(0, 20_000),
                "q": f"q{rng.randrange(5)}",
                "ms": rng.randrange(0, 4_000) / 8,
            }
            for i in range(100)
        ]
        if (
            name == "backfill.jsonl"
        ):  # no time in its name: read once the timed files are, its records on time there
            rows = [dict(r, ts=T0 + 60_000 + rng.randrange(0, 5_000)) for r in rows]
        rows.sort(key=lambda r: r["ts"])
        for i in range(0, len(rows) - 1, 5):  # disorder within the declared lateness
            if rows[i + 1]["ts"] - rows[i]["ts"] < LATENESS:
                rows[i], rows[i + 1] = rows[i + 1], rows[i]
        kept += rows
        lines = [json.dumps(r) + "\n" for r in rows]
        if f:
            lines.insert(30, json.dumps(rng.choice(sent)) + "\n")  # duplicates of earlier files
            lines.insert(70, json.dumps(rng.choice(sent)) + "\n")
        if f == 1:
            lines.insert(50, "{not json\n")
            lines.append(
                json.dumps({"id": "nan1", "ts": start + 19_990, "q": "q1", "ms": "n/a"}) + "\n"
            )  # no number
            lines.append(
                json.dumps({"id": "late1", "ts": start - 10_000, "q": "q1", "ms": 1.0}) + "\n"
            )  # behind the file: late
        sent += rows
        (d / name).write_text("".join(lines))
    return pd.DataFrame(kept)


def topology(d, cls: type) -> Topology:
    t = Topology("aggregates")
    t.injector(
        "queries", LogFileSource(d, finite=True, lateness_ms=LATENESS, max_bytes_per_batch=3_000)
    )
    t.computation(
        cls,
        name="Agg",
        inputs={"queries": lambda r: r.value["q"]},
        outputs=["window_aggregates"],
        options=ComputationOptions(late=LatePolicy.drop()),
        params=PARAMS,
    )
    t.sink("window_aggregates")
    return t


def _dead(records) -> Counter:
    return Counter((r.id, r.value.stage, r.value.reason) for r in records)


@pytest.mark.timeout(900)
def test_windowed_aggregate_is_the_same_on_every_path_and_the_pandas_answer(
    tmp_path, spark, productions
):
    kept = write_logs(tmp_path / "logs")
    per_record = Harness(topology(tmp_path / "logs", WindowAggregate), raise_errors=False)
    per_record.run_sources()
    columnar = Harness(topology(tmp_path / "logs", ColumnarWindowAggregate), raise_errors=False)
    columnar.run_sources()
    rt = SparkRuntime(
        topology(tmp_path / "logs", ColumnarWindowAggregate),
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=4),
        spark=spark,
    )
    rt.run(timeout_s=800)
    expected = productions(per_record.output("window_aggregates"))
    assert sum(expected.values()) > 100
    assert productions(columnar.output("window_aggregates")) == expected
    assert productions(rt.output("window_aggregates"), ids=False) == productions(
        per_record.output("window_aggregates"), ids=False
    )
    dead = _dead(per_record.dead_letters())
    assert dead == _dead(columnar.dead_letters()) == _dead(rt.dead_letters())
    assert Counter(s for _, s, _ in dead.elements()) == {
        Stage.MALFORMED: 1,
        Stage.PROCESS_RECORD: 1,
    }
    a, b, c = per_record.metrics("Agg"), columnar.metrics("Agg"), rt.computations["Agg"].metrics
    for name in ("records_in", "duplicates", "late", "late_dropped", "processed", "productions"):
        assert a[name] == b[name] == c[name], name
    assert a["duplicates"] == 6 and a["late"] == 1
    # the plain answer: the mean of every window over the distinct on-time records
    rows = [
        (r["q"], s, r["ms"])
        for r in kept.to_dict("records")
        for s in window_starts(r["ts"], PARAMS["window_ms"], PARAMS["slide_ms"])
    ]
    answer = (
        pd.DataFrame(rows, columns=["key", "start", "ms"])
        .groupby(["key", "start"])["ms"]
        .mean()
        .to_dict()
    )
    got = {(v["key"], v["window_start"]): v["mean"] for v in rt.values("window_aggregates")}
    assert got.keys() == answer.keys()
    assert all(math.isclose(got[k], answer[k], rel_tol=1e-12) for k in answer)
