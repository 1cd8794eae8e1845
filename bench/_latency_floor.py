"""Spark's own stateful latency floor, and where a batch's time goes (``latency_bench.py``).

Not a benchmark by itself. What ``bench/latency_bench.py`` measures beside millwheel's stages,
in the same session, on the same trigger (0: a batch as soon as the previous one ends):

* :func:`floor` — a native stateful Spark query fed like a millwheel stage: a writer thread
  drops a Parquet file of ``rate * every_s`` records every ``every_s`` seconds into a
  directory (atomic rename, as the injector's stream log does), the query reads it with a
  file source, runs one stateful operator and writes each batch's output with the driver
  (``toArrow`` and one Parquet file renamed into view, the outbox's driver writer). Kinds:

  - ``native``: ``dropDuplicates("id")``, the JVM's stateful pass-through (a shuffle by id,
    one state-store row per record) — the floor of any stateful query here;
  - ``python``: ``applyInPandasWithState`` over ``groups`` groups passing every record
    through and keeping a count per group — the floor of a Python stateful operator, the
    shape of millwheel's interval-row plan without millwheel;
  - ``python_hb``: the same with a second file source unioned in, a one-row file every 0.1 s
    (as a millwheel driver writes heartbeats at ``heartbeat_ms=100``), and an event-time
    watermark on its column: what a query's second source and its union cost a batch;
  - ``python_glob``: ``python_hb``'s two directories read by one file source, a glob over
    both (``{hb,in}``), the heartbeat rows told apart by their columns: what a second
    source costs beside the union.

  A record's latency: from its send time (just before its file is written) to its batch's
  file being visible (in the sink, before Spark's commit: the earliest a native query's
  output can be read).
* :func:`breakdown` — each record's latency cut at its batch's start and end (Spark's progress
  reports): *wait* (for the batch that reads it to start), *run* (that batch) and *publish*
  (from the batch's end to its output visible; millwheel publishes after the commit).
* :func:`spark_stages` — with the Spark UI on, each batch's Spark stages read from its REST
  API: the median duration and task time of a query's scan (map) stage and its stateful
  (result) stage.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _spark_bench import read_input

FLOOR_KINDS = ("native", "python", "python_hb", "python_glob")
INPUT_SCHEMA = "id string, k long, sent double"


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s))) - 1))]


def _ts(text: str) -> float:
    """A progress report's ``timestamp`` (``2026-11-28T15:00:00.123Z``) as epoch seconds."""
    return (
        datetime.strptime(text.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
        .replace(tzinfo=timezone.utc)
        .timestamp()
    )


def batch_spans(progress: dict[int, dict]) -> dict[int, tuple[float, float]]:
    """Batch id -> (start, end) in epoch seconds, from Spark's progress reports."""
    return {
        b: (_ts(p["timestamp"]), _ts(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000)
        for b, p in progress.items()
    }


def breakdown(
    records: list[tuple[float, float, int]],
    spans: dict[int, tuple[float, float]],
    skip_before: float,
) -> dict[str, Any]:
    """Latency p50/p95 and its median parts over ``records`` — (input visible, output visible,
    batch id) — whose input became visible at or after ``skip_before`` (the warm-up is not counted)."""
    kept = [r for r in records if r[0] >= skip_before]
    lat = [out - inp for inp, out, _ in kept]
    wait, run, publish = [], [], []
    for inp, out, b in kept:
        span = spans.get(b)
        if span is None:
            continue
        start, end = span
        wait.append(max(0.0, start - inp))
        run.append(end - max(start, inp))
        publish.append(out - end)
    return {
        "records": len(kept),
        "p50_s": pct(lat, 50),
        "p95_s": pct(lat, 95),
        "median_wait_s": pct(wait, 50),
        "median_run_s": pct(run, 50),
        "median_publish_s": pct(publish, 50),
    }


def progress_summary(progress: dict[int, dict], skip_before: float = 0.0) -> dict[str, Any]:
    """Data batches' ``triggerExecution`` p50/p95, the parts of the median one, and the
    stateful operator's own times (``stateOperators``)."""
    ps = [p for p in progress.values() if read_input(p) and _ts(p["timestamp"]) >= skip_before]
    if not ps:
        return {}
    times = [p["durationMs"]["triggerExecution"] for p in ps]
    median = sorted(ps, key=lambda p: p["durationMs"]["triggerExecution"])[len(ps) // 2]
    parts = [
        "latestOffset",
        "getBatch",
        "queryPlanning",
        "walCommit",
        "addBatch",
        "commitOffsets",
    ]
    return {
        "data_batches": len(ps),
        "batches": len(progress),
        "trigger_ms_p50": pct(times, 50),
        "trigger_ms_p95": pct(times, 95),
        "median_batch_parts_ms": median["durationMs"],
        "median_of_each_part_ms": {
            k: pct([p["durationMs"].get(k, 0) for p in ps], 50) for k in parts
        },
        "rows_per_batch_p50": pct([p["numInputRows"] for p in ps], 50),
        # the stateful operator's time, summed over its tasks: with a timeout set,
        # ``allRemovalsTimeMs`` is the second Python runner each task starts for timed-out groups
        "state_ms_p50": {
            k: pct([sum(o.get(k, 0) for o in p.get("stateOperators") or []) for p in ps], 50)
            for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")
        },
    }


def _write_input(d: Path, rate: int, seconds: float, every_s: float, stop: threading.Event) -> int:
    """The paced input: one file every ``every_s`` until ``seconds`` passed; returns the rows written."""
    n = 0
    start = nxt = time.time()
    seq = 0
    while time.time() - start < seconds and not stop.is_set():
        if time.time() < nxt:
            time.sleep(0.005)
            continue
        now = time.time()
        rows = int(rate * every_s)
        table = pa.table(
            {
                "id": pa.array([f"p{n + i}" for i in range(rows)], pa.string()),
                "k": pa.array([(n + i) % 100 for i in range(rows)], pa.int64()),
                "sent": pa.array([now] * rows, pa.float64()),
            }
        )
        name = f"{seq:08d}.parquet"
        pq.write_table(table, d / f".{name}.tmp")
        os.replace(d / f".{name}.tmp", d / name)
        n += rows
        seq += 1
        nxt += every_s
    return n


class _PassThrough:
    """``applyInPandasWithState``: every record out as it came, a count of the group's records kept."""

    def __call__(self, key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:
        n = state.get[0] if state.exists else 0
        for f in frames:
            f = f[f["id"].notna()]  # ``python_hb``'s and ``python_glob``'s heartbeat rows
            n += len(f)
            yield f[["id", "sent"]]
        state.update((n,))


def _write_heartbeats(d: Path, every_s: float, stop: threading.Event) -> None:
    """``python_hb``'s second source: a one-row file every ``every_s`` (its watermark: the time)."""
    seq = 0
    while not stop.is_set():
        name = f"{seq:08d}.parquet"
        pq.write_table(
            pa.table({"wm": pa.array([int(time.time() * 1000)], pa.int64())}), d / f".{name}.tmp"
        )
        os.replace(d / f".{name}.tmp", d / name)
        seq += 1
        stop.wait(every_s)


def floor(
    spark: Any,
    work: Path,
    kind: str,
    rate: int,
    seconds: float,
    *,
    groups: int = 8,
    every_s: float = 0.2,
    collect_every_s: float = 2.0,
) -> tuple[list[tuple[float, float, int]], dict[int, dict], str, dict[int, list[float]]]:
    """One paced run of the ``kind`` floor query; returns its records (sent, visible, batch),
    its progress reports, its run id and its sink's times per batch."""
    import sys

    from pyspark import cloudpickle
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from millwheel.runtime._session import LOCAL_CHECKPOINT_CONF, restore_conf, set_conf

    # the workers may not have bench/ on their path: the pass-through travels by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    root = work / f"floor-{kind}"
    shutil.rmtree(root, ignore_errors=True)
    inp, out = root / "in", root / "out"
    inp.mkdir(parents=True)
    out.mkdir()
    src = spark.readStream.schema(INPUT_SCHEMA).option("maxFileAge", "36500d").parquet(str(inp))
    if kind == "native":
        frame = src.dropDuplicates(["id"])
    elif kind in ("python", "python_hb", "python_glob"):
        if kind != "python":
            (root / "hb").mkdir()
        if kind == "python_glob":
            src = (
                spark.readStream.schema(f"{INPUT_SCHEMA}, wm long")
                .option("maxFileAge", "36500d")
                .parquet(f"{root}/{{hb,in}}")
                .withColumn("k", F.coalesce(F.col("k"), F.lit(-1).cast("long")))
                .withColumn("wm_ts", F.timestamp_millis("wm"))
                .withWatermark("wm_ts", "0 seconds")
            )
        elif kind == "python_hb":
            hb = (
                spark.readStream.schema("wm long")
                .option("maxFileAge", "36500d")
                .parquet(str(root / "hb"))
                .select(F.lit(-1).cast("long").alias("k"), F.col("wm"))
            )
            src = (
                hb.unionByName(
                    src.withColumn("wm", F.lit(None).cast("long")), allowMissingColumns=True
                )
                .withColumn("wm_ts", F.timestamp_millis("wm"))
                .withWatermark("wm_ts", "0 seconds")
            )
        frame = (
            src.withColumn("group", F.pmod(F.col("k"), F.lit(groups)))
            .groupBy("group")
            .applyInPandasWithState(
                _PassThrough(),
                "id string, sent double",
                "n long",
                "append",
                GroupStateTimeout.NoTimeout,
            )
        )
    else:
        msg = f"floor kind {kind!r}: one of {FLOOR_KINDS}"
        raise ValueError(msg)
    records: list[tuple[float, float, int]] = []
    #: batch id -> (sink entered, rows collected): as ``latency_bench._sink_timing`` for millwheel
    sinks: dict[int, list[float]] = {}

    def sink(df: Any, batch_id: int) -> None:
        entered = time.time()
        table = df.toArrow()
        sinks[batch_id] = [entered, time.time(), 0.0, 0.0]
        name = f"{batch_id:010d}.parquet"
        pq.write_table(table, out / f".{name}.tmp")
        os.replace(out / f".{name}.tmp", out / name)
        at = time.time()
        sinks[batch_id][2:] = [at, at]
        records.extend((s, at, batch_id) for s in table.column("sent").to_pylist())

    # the checkpoint file manager millwheel runs a local checkpoint with (one rename, no child
    # process per file: ``_session.LOCAL_CHECKPOINT_CONF``), set for the floor's run as well
    saved = set_conf(spark, LOCAL_CHECKPOINT_CONF)
    q = (
        frame.writeStream.queryName(f"floor.{kind}")
        .foreachBatch(sink)
        .option("checkpointLocation", str(root / "checkpoint"))
        .start()
    )
    progress: dict[int, dict] = {}
    stop = threading.Event()
    written = [0]
    writer = threading.Thread(
        target=lambda: written.__setitem__(0, _write_input(inp, rate, seconds, every_s, stop)),
        daemon=True,
    )
    writer.start()
    if kind in ("python_hb", "python_glob"):
        threading.Thread(
            target=_write_heartbeats, args=(root / "hb", 0.1, stop), daemon=True
        ).start()
    collected = time.monotonic()
    deadline = time.monotonic() + seconds + 300
    try:
        while (writer.is_alive() or len(records) < written[0]) and time.monotonic() < deadline:
            if time.monotonic() - collected >= collect_every_s:
                for p in q.recentProgress:
                    progress[p["batchId"]] = p
                collected = time.monotonic()
            if q.exception() is not None:
                msg = f"floor query {kind}: {q.exception()}"
                raise RuntimeError(msg)
            time.sleep(0.05)
    finally:
        stop.set()
        for p in q.recentProgress:
            progress[p["batchId"]] = p
        run_id = str(q.runId)
        q.stop()
        restore_conf(spark, saved)
    return records, progress, run_id, sinks


def spark_stages(spark: Any, run_ids: dict[str, str]) -> dict[str, Any]:
    """Per query (name -> run id): the median Spark stages of its batches' jobs, from the UI's
    REST API (``{}`` without the UI). A batch's job is the map stage (scan, shuffle write)
    then the result stage (the stateful operator, state-store commit, the collect)."""
    url = spark.sparkContext.uiWebUrl
    if not url:
        return {}
    app = spark.sparkContext.applicationId
    base = f"{url}/api/v1/applications/{app}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{base}/{path}") as r:
            return json.load(r)

    jobs = get("jobs")
    stages = {(s["stageId"], s["attemptId"]): s for s in get("stages?status=complete")}
    out: dict[str, Any] = {}
    for name, run_id in run_ids.items():
        by_position: dict[int, dict[str, list[float]]] = {}
        for job in jobs:
            tags = f"{job.get('jobGroup')} {job.get('description')}"
            if run_id not in tags or job.get("status") != "SUCCEEDED":
                continue
            ids = sorted(job["stageIds"])
            done = [stages[(i, 0)] for i in ids if (i, 0) in stages]
            for pos, s in enumerate(done):
                start = _ts(s["submissionTime"].replace("GMT", "Z"))
                end = _ts(s["completionTime"].replace("GMT", "Z"))
                d = by_position.setdefault(pos, {"wall_ms": [], "task_ms": [], "tasks": []})
                d["wall_ms"].append((end - start) * 1000)
                d["task_ms"].append(s["executorRunTime"])
                d["tasks"].append(s["numTasks"])
        out[name] = {
            f"stage{pos}": {
                "jobs": len(d["wall_ms"]),
                "wall_ms_p50": pct(d["wall_ms"], 50),
                "task_ms_p50": pct(d["task_ms"], 50),
                "tasks_p50": pct(d["tasks"], 50),
            }
            for pos, d in sorted(by_position.items())
        }
    return out
