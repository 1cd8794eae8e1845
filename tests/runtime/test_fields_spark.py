"""Declared fields end to end on local Spark (``millwheel/_fields.py``, ``runtime/_fieldcols.py``).

Click logs named as a user's (``clicks-2026-01-01.jsonl``), with records out of order
across files, duplicate lines and bad lines, where most values
conform to the stream's declaration and some do not (an extra key; a string in the int
field). The stream declares its fields; ``ColumnarWindowAggregate`` sums ``value.ms``
(never the whole value) and a per-record computation echoes every value. The harness,
local Spark and a plain pandas answer must agree: every record counted once and right,
the conforming values stored as columns in the stream-log files (``value`` null), and
the per-record computation seeing exactly the values it sees on an undeclared stream.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pyarrow.parquet as pq
import pytest

from computations.columnar_windowing import ColumnarWindowAggregate
from computations.windowing import window_starts
from millwheel import Computation, ComputationOptions, LatePolicy, LogFileSource, Stage, Topology
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime.rundir import FileStreamLog
from millwheel.testing import Harness

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LATENESS = 4_000
FIELDS = {"id": str, "ts": int, "page": str, "ms": int}
PARAMS = {"aggregate": "sum", "field": "ms", "window_ms": 10_000}
AGG_FIELDS = {
    "key": str,
    "window_start": int,
    "window_end": int,
    "count": int,
    "sum": float,
    "update": int,
}


class EchoValues(Computation):
    def process_record(self, record):
        self.produce("echo", record.value)


def write_logs(d) -> tuple[list[dict], int, str]:
    """The logs; returns the distinct well-formed values, how many conform, and the id of the string in the int field."""
    d.mkdir()
    rng = random.Random(26)
    distinct: list[dict] = []
    days = []
    for day in range(3):
        rows = [
            {
                "id": f"d{day}-{i}",
                "ts": T0 + day * 86_400_000 + rng.randrange(30_000),
                "page": f"p{rng.randrange(4)}",
                "ms": rng.randrange(1, 900),
            }
            for i in range(60)
        ]
        rows.sort(key=lambda r: r["ts"])
        for i in range(0, len(rows) - 1, 4):  # disorder within a file, within the lateness
            if rows[i + 1]["ts"] - rows[i]["ts"] < LATENESS:
                rows[i], rows[i + 1] = rows[i + 1], rows[i]
        days.append(rows)
    # disorder across files: a day's last records written early, in the previous day's file
    days[0] += days[1][-3:]
    del days[1][-3:]
    days[1][10] = {**days[1][10], "ref": "mail"}  # an extra key: pickled, its field still read
    days[1][20] = {
        **days[1][20],
        "ms": "12",
    }  # a string in the int field: pickled, a dead letter of the sum
    bad = days[1][20]["id"]
    for day, rows in enumerate(days):
        distinct += rows
        lines = [json.dumps(r) + "\n" for r in rows]
        if day:  # duplicate lines, re-sent later in their file
            lines.insert(40, lines[rng.randrange(10)])
            lines.insert(50, lines[rng.randrange(10)])
        if day == 2:
            lines.insert(25, "{not json\n")
            lines.insert(
                35, json.dumps({"id": "nots", "page": "p1", "ms": 3}) + "\n"
            )  # no timestamp
        (d / f"clicks-2026-01-0{day + 1}.jsonl").write_text("".join(lines))
    return distinct, len(distinct) - 2, bad


def topology(d, declared: bool, mapping: str = "default") -> Topology:
    t = Topology("fields")
    t.injector(
        "clicks", LogFileSource(d, finite=True, lateness_ms=LATENESS, max_bytes_per_batch=4_000)
    )
    if declared:
        t.stream("clicks", fields=FIELDS)
    t.computation(
        ColumnarWindowAggregate,
        name="Agg",
        inputs={"clicks": lambda r: r.value["page"]},
        outputs=["window_aggregates"],
        options=ComputationOptions(late=LatePolicy.drop(), mapping=mapping),
        params=PARAMS,
    )
    t.computation(EchoValues, inputs={"clicks": lambda r: r.value["id"]}, outputs=["echo"])
    if declared:  # productions too: a per-record step's (echo) and a columnar one's (the sums)
        t.stream("echo", fields=FIELDS)
        t.stream("window_aggregates", fields=AGG_FIELDS)
    return t


def _values(values) -> Counter:
    return Counter(json.dumps(v) for v in values)  # key order counts


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mapping", ["default", "arrow"])
def test_a_declared_stream_gives_every_path_the_same_answer_and_stores_columns(
    tmp_path, spark, mapping
):
    distinct, conforming, bad = write_logs(tmp_path / "logs")
    plain = Harness(topology(tmp_path / "logs", declared=False), raise_errors=False)
    plain.run_sources()
    declared = Harness(topology(tmp_path / "logs", declared=True), raise_errors=False)
    declared.run_sources()
    rt = SparkRuntime(
        topology(tmp_path / "logs", declared=True, mapping=mapping),
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=2),
        spark=spark,
    )
    rt.run(timeout_s=500)

    # the per-record computation sees the same values, declared or not, on both backends
    echoed = _values(plain.values("echo"))
    assert echoed == _values(declared.values("echo")) == _values(rt.values("echo"))
    assert echoed == _values(
        distinct
    )  # each record once (duplicates dropped by id), its keys in order
    assert all(type(v["ms"]) in (int, str) and type(v["ts"]) is int for v in rt.values("echo"))

    # the sum of value.ms: the same productions everywhere, and the pandas answer
    sums = Counter(
        (r.id, r.timestamp, json.dumps(r.value, sort_keys=True))
        for r in plain.output("window_aggregates")
    )
    assert sum(sums.values()) > 10
    assert (
        Counter(
            (r.id, r.timestamp, json.dumps(r.value, sort_keys=True))
            for r in declared.output("window_aggregates")
        )
        == sums
    )
    # (ids aside: a key's windows may fire in another order across Spark's batches than the
    # harness's rounds, declared or not, so its production sequence numbers differ)
    assert Counter((t, v) for _, t, v in sums.elements()) == Counter(
        (r.timestamp, json.dumps(r.value, sort_keys=True)) for r in rt.output("window_aggregates")
    )
    good = pd.DataFrame([r for r in distinct if type(r["ms"]) is int])
    rows = [
        (r["page"], s, r["ms"])
        for r in good.to_dict("records")
        for s in window_starts(r["ts"], 10_000, 10_000)
    ]
    answer = (
        pd.DataFrame(rows, columns=["key", "start", "ms"])
        .groupby(["key", "start"])
        .agg(n=("ms", "size"), total=("ms", "sum"))
    )
    got = {
        (v["key"], v["window_start"]): (v["count"], v["sum"])
        for v in rt.values("window_aggregates")
    }
    assert got == {k: (int(n), float(t)) for k, (n, t) in answer.iterrows()}

    # dead letters: the two bad lines at the injector, the string in the int field at the sum
    dead = Counter(
        (d.value.computation or "", d.value.stage, d.value.record.id if d.value.record else None)
        for d in rt.dead_letters()
    )
    stages = Counter(s for _, s, _ in dead.elements())
    assert stages == {Stage.PROCESS_RECORD: 1, Stage.MALFORMED: 2}
    assert [(c, rid) for c, s, rid in dead if s == Stage.PROCESS_RECORD] == [("Agg", bad)]
    a, c = declared.metrics("Agg"), rt.computations["Agg"].metrics
    for name in ("records_in", "duplicates", "processed", "dead_letters", "productions"):
        assert a[name] == c[name], name
    assert c["duplicates"] == 4 and c["records_in"] == len(distinct) + 4

    # the files really hold the conforming values as columns: the injector's, and the productions
    log = FileStreamLog.at(str(tmp_path / "run"))
    assert _stored(log, "clicks") == (
        conforming + 4,
        2,
    )  # duplicates conform too; the extra key and the string are pickled
    assert _stored(log, "echo") == (conforming, 2)
    assert _stored(log, "window_aggregates") == (len(got), 0)


def _stored(log: FileStreamLog, stream: str) -> tuple[int, int]:
    """How many rows of ``stream``'s files are stored as columns, and how many pickled."""
    stored = pickled = 0
    for producer in log.producers(stream):
        loc = log.location(stream, producer)
        for name in log.files(stream, producer):
            t = pq.read_table(loc.child(name).path, columns=["value", "fields"])
            has = [f is not None for f in t.column("fields").to_pylist()]
            assert [v is None for v in t.column("value").to_pylist()] == has
            stored += sum(has)
            pickled += len(has) - sum(has)
    return stored, pickled
