"""Differential test of a columnar computation (``millwheel/_columnar.py``): harness vs local Spark vs the
per-record computation vs a plain batch count of the same log lines.

The logs: three files named by their time, queries out of order inside a file and across
files (within the declared ``lateness_ms``), duplicates re-sent in later files, a record
behind its file's time (late), and a malformed line. ``ColumnarWindowCounter`` on Spark
(the columnar interval function) and in the harness must give the per-record
``WindowCounter``'s productions — ids included in the harness; on Spark the ids are the
run's own (``millwheel/_identity.py``) — and dead letters, and its non-zero
counts must be the plain count of distinct, on-time, well-formed lines.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pytest

from computations.columnar_windowing import ColumnarWindowCounter
from computations.windowing import WindowCounter
from millwheel import (
    MAX_TIMESTAMP,
    ColumnarComputation,
    ComputationOptions,
    ErrorPolicy,
    LatePolicy,
    LogFileSource,
    Record,
    SampleSource,
    Stage,
    Topology,
)
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._settings import SettingsError
from millwheel.runtime.plans import PlanKind, choose_plan
from millwheel.testing import Harness

pytestmark = pytest.mark.spark

T0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z
LATENESS = 3_000


def write_logs(d) -> Counter:
    """The log files; returns the plain answer: distinct on-time ids per (query, 1 s bucket)."""
    d.mkdir()
    rng = random.Random(26)
    answer: Counter = Counter()
    sent: list[dict] = []
    for f in range(3):
        start = T0 + f * 20_000
        rows = []
        for i in range(120):
            ts = start + rng.randrange(0, 20_000)
            row = {"id": f"f{f}-{i}", "ts": ts, "query": f"q{rng.randrange(6)}"}
            rows.append(row)
        rows.sort(key=lambda r: r["ts"])
        # disorder inside the file, within the declared lateness
        for i in range(0, len(rows) - 1, 7):
            if rows[i + 1]["ts"] - rows[i]["ts"] < LATENESS:
                rows[i], rows[i + 1] = rows[i + 1], rows[i]
        if f:
            rows.insert(40, dict(rng.choice(sent)))  # a duplicate from an earlier file
            rows.insert(80, dict(rng.choice(sent)))
        for r in rows:
            if not r["id"].startswith(f"f{f}-"):
                continue
            answer[(r["query"], r["ts"] // 1_000 * 1_000)] += 1
        sent += [r for r in rows if r["id"].startswith(f"f{f}-")]
        lines = [json.dumps(r) + "\n" for r in rows]
        if f == 1:
            lines.insert(60, "{not json\n")
            lines.append(
                json.dumps({"id": "late1", "ts": start - 10_000, "query": "q1"}) + "\n"
            )  # behind the file: late
        name = f"queries-2026-01-01T10-00-{f * 20:02d}.jsonl"
        (d / name).write_text("".join(lines))
    return answer


def topology(d, cls: type, name: str = "Counter", mapping: str = "default") -> Topology:
    t = Topology("columnar")
    t.injector(
        "queries", LogFileSource(d, finite=True, lateness_ms=LATENESS, max_bytes_per_batch=4_000)
    )
    t.computation(
        cls,
        name=name,
        inputs={"queries": lambda r: r.value["query"]},
        outputs=["window_counts"],
        options=ComputationOptions(late=LatePolicy.drop(), mapping=mapping),
        params={"window_ms": 1_000, "trailing_empty": 2},
    )
    t.sink("window_counts")
    return t


def _dead(records) -> Counter:
    return Counter(
        (r.id, r.timestamp, r.value.stage, r.value.reason, r.value.file, r.value.offset)
        for r in records
    )


#: the two mappings of a columnar computation on Spark (``ComputationOptions.mapping``)
MAPPINGS = ["default", "arrow"]


@pytest.fixture(scope="module", params=[*MAPPINGS, "default-rows", "arrow-rows"])
def runs(request, tmp_path_factory, spark):
    """Per mapping, reading its records from the batch's files and as rows (a query with the
    keying stage reads every input as rows, ``plans/_inputs.py``): the per-record harness, the columnar harness, the columnar computation on Spark, the plain answer."""
    base = tmp_path_factory.mktemp(f"columnar-{request.param}")
    mapping, _, plan = request.param.partition("-")
    answer = write_logs(base / "logs")
    per_record = Harness(topology(base / "logs", WindowCounter), raise_errors=False)
    per_record.run_sources()
    columnar = Harness(
        topology(base / "logs", ColumnarWindowCounter, mapping=mapping), raise_errors=False
    )
    columnar.run_sources()
    topo = topology(base / "logs", ColumnarWindowCounter, mapping=mapping)
    settings = RuntimeSettings(drain=True, intervals=4, lockstep=True)
    rt = SparkRuntime(topo, str(base / "run"), settings, spark=spark)
    # as after a record its producer did not key: the query keeps the keying stage
    counter = rt.computations["Counter"]
    counter._keying_forced = plan == "rows"
    stop, counter.run_ids = counter.stop, []

    def stop_recording_its_run() -> None:  # the query's Spark jobs are grouped by its run id
        if counter.query is not None:
            counter.run_ids.append(str(counter.query.runId))
        stop()

    counter.stop = stop_recording_its_run
    rt.run(timeout_s=600)
    assert bool(counter.scanned) == (plan != "rows")  # the plan the run had
    return per_record, columnar, rt, answer


def test_an_arrow_batch_runs_one_spark_stage_unless_its_rows_are_needed(runs, spark):
    """``ArrowMapping.tasks``: a query whose tasks read every record from the batch's files
    runs each batch as one stage of a task per partition (no scan, no shuffle: Spark plans the
    micro-batch's frame and never runs it); with an input read as rows, as a scan and a shuffle."""
    _, _, rt, _ = runs
    counter = rt.computations["Counter"]
    if counter.plan.kind is not PlanKind.ARROW:
        pytest.skip("the Arrow mapping's jobs")
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for r in counter.run_ids for j in tracker.getJobIdsForGroup(r)]
    stages = Counter(len(j.stageIds) for j in jobs if j is not None)
    assert sum(stages.values()) >= counter.batches > 3
    assert stages == ({1: stages[1]} if counter.scanned else {2: stages[2]}), stages


def test_same_productions_everywhere(runs, productions):
    per_record, columnar, rt, _ = runs
    expected = productions(per_record.output("window_counts"))
    assert sum(expected.values()) > 100
    assert productions(columnar.output("window_counts")) == expected
    assert productions(rt.output("window_counts"), ids=False) == productions(
        per_record.output("window_counts"), ids=False
    )


def test_counts_are_the_plain_batch_answer(runs):
    _, _, rt, answer = runs
    got = Counter()
    for v in rt.values("window_counts"):
        if v["count"]:
            got[(v["key"], v["window_start"])] += v["count"]
    assert got == answer


def test_same_dead_letters_and_counters(runs):
    per_record, columnar, rt, _ = runs
    assert (
        _dead(rt.dead_letters())
        == _dead(per_record.dead_letters())
        == _dead(columnar.dead_letters())
    )
    assert Counter(r.value.stage for r in rt.dead_letters()) == {Stage.MALFORMED: 1}
    a, b, c = (
        per_record.metrics("Counter"),
        columnar.metrics("Counter"),
        rt.computations["Counter"].metrics,
    )
    for name in ("records_in", "duplicates", "late", "late_dropped", "processed", "productions"):
        assert a[name] == b[name] == c[name], name
    assert a["duplicates"] == 4 and a["late"] == 1  # two re-sent in each later file


def test_a_columnar_computation_refuses_the_per_key_layout():
    t = topology(".", ColumnarWindowCounter)
    with pytest.raises(SettingsError, match="interval-row layout only"):
        choose_plan(t.computations["Counter"], "keys")


class Picky(ColumnarComputation):
    """Counts per user; a record whose value says ``boom`` raises, failing its whole call."""

    def process_batch(self, batch):
        r = batch.records
        if any(v.get("boom") for v in r["value"]):
            msg = "boom in this batch"
            raise ValueError(msg)
        n = r.groupby("key", observed=True).size().rename("n").reset_index()
        rows = pd.concat([batch.state, n]).groupby("key", observed=True, as_index=False)["n"].sum()
        batch.set_state(rows.astype({"n": "int64"}))
        batch.set_timers(rows["key"], ["end"] * len(rows), [MAX_TIMESTAMP] * len(rows))

    def process_timers(self, batch, timers):
        s = batch.state
        batch.produce(
            "totals",
            [{"user": k, "n": n} for k, n in zip(s["key"].tolist(), s["n"].tolist(), strict=True)],
            keys=s["key"],
            timestamps=[T0] * len(s),
        )


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_a_failing_record_is_dead_lettered_on_spark_as_in_the_harness(
    tmp_path, spark, mapping, productions
):
    """A call that raises falls back per key, then per record: only the failing record is
    dead-lettered (with the per-record path's id), the key keeps its other records."""
    recs = [Record(None, {"user": f"u{i % 3}", "boom": i == 4}, T0 + i, f"r{i}") for i in range(12)]

    def topo():
        t = Topology("picky")
        t.injector("clicks", SampleSource(recs))
        opts = ComputationOptions(on_error=ErrorPolicy.DEAD_LETTER, mapping=mapping)
        t.computation(
            Picky, inputs={"clicks": lambda r: r.value["user"]}, outputs=["totals"], options=opts
        )
        t.sink("totals")
        return t

    h = Harness(topo(), raise_errors=False)
    h.run_sources()
    rt = SparkRuntime(
        topo(), str(tmp_path / "run"), RuntimeSettings(drain=True, intervals=2), spark=spark
    )
    rt.run(timeout_s=600)
    assert productions(rt.output("totals"), ids=False) == productions(h.output("totals"), ids=False)
    assert sorted((v["user"], v["n"]) for v in rt.values("totals")) == [
        ("u0", 4),
        ("u1", 3),
        ("u2", 4),
    ]
    dead = [(d.id, d.value.stage, d.value.record.id, d.value.reason) for d in rt.dead_letters()]
    assert dead == [
        (d.id, d.value.stage, d.value.record.id, d.value.reason) for d in h.dead_letters()
    ]
    assert [(s, rid, reason) for _, s, rid, reason in dead] == [
        (Stage.PROCESS_RECORD, "r4", "ValueError: boom in this batch")
    ]
