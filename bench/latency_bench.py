"""Latency benchmark on Spark (a command, not a test): ``python bench/latency_bench.py``.

Continuous-mode runs (trigger 0, ``local[2]``, streams pruned), in one session:

1. **Per-stage latency, with Spark's own floor beside it.** An injector paced at ``--rate``
   records/s for ``--seconds`` feeds ``A -> B`` (each produces one record per input; ``--mw``:
   per-record computations ``mw``, columnar ones ``mwcol``, columnar ones on the Arrow
   mapping ``mwarrow``).
   A stage's latency is the time from its input becoming visible (injector send time;
   ``A``'s publication) to its output becoming visible in the stream log (the outbox
   publication after the commit). The floor (``--floors``, ``_latency_floor.py``) is a
   native stateful Spark query fed the same way — the same rate, files every 0.2 s read by
   a file source, the same trigger, a ``foreachBatch`` sink whose driver writes a batch's
   output — run between millwheel's runs: ``native`` (``dropDuplicates``, the JVM's
   stateful pass-through) and ``python`` (``applyInPandasWithState`` passing records
   through, millwheel's plan without millwheel). The runs go in rounds, each round every
   variant once, the order turned by one each round; round 0 is the session's warm-up
   (reported as *cold*, every record), later rounds are *warm* (records sent in a run's
   first ``--skip-s`` seconds left out). Each latency is cut into *wait* (for the batch
   that reads it), *run* (that batch) and *publish* (batch end to output visible); each
   query's micro-batch time (Spark's ``triggerExecution``) and, with ``--ui``, its Spark
   stages (the REST API).
2. **State held over time** (``--steady-seconds``): one long run of the two stages and of
   the native floor, cut into slices (:func:`slices`): a batch's time as the state held
   grows. ``B`` is keyed by record id, so it holds a key per record until its dedup ids
   pass the horizon (``DedupOptions.slack_ms``, ten minutes by default; ``--slack-s``).
3. **Zeitgeist, paced.** The generator writes a sample whose event time is wall time; a
   writer thread appends each file's lines while its writing interval passes, as a
   logger would; the topology reads the growing directory. The dip (and spike) delay is
   ``detected_at - window end`` of each matched anomaly (``docs/zeitgeist.md``), end to
   end: log line written -> four queries -> anomaly visible.

Figures go to stdout and ``--out`` (default ``bench/results/latency.json``), with the
commit measured and the machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import pickle
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
from _git import git_head  # noqa: E402
from _latency_floor import (  # noqa: E402
    FLOOR_KINDS,
    batch_spans,
    breakdown,
    floor,
    pct,
    progress_summary,
    spark_stages,
)
from _spark_bench import collect, read_input, run_collecting, write_results  # noqa: E402

from millwheel import (  # noqa: E402
    MAX_TIMESTAMP,
    ColumnarComputation,
    Computation,
    ComputationOptions,
    DedupOptions,
    Record,
    Source,
    SourceBatch,
    Topology,
)

RESULTS = ROOT / "bench" / "results" / "latency.json"
#: millwheel's variants of the two stages: per-record computations, columnar ones on the
#: default mapping (``applyInPandasWithState``), columnar ones on the Arrow mapping
MW_KINDS = ("mw", "mwcol", "mwarrow")


class Paced(Source):
    """``rate`` records/s in batches every ``every_s``, for ``seconds``; values carry the send time."""

    def __init__(self, rate: int, seconds: float, every_s: float = 0.2) -> None:
        self.rate, self.seconds, self.every_s = rate, seconds, every_s

    def batches(self, injector: str = "injector", stream: str = "records"):
        start = time.time()
        n = 0
        nxt = start
        while time.time() - start < self.seconds:
            if time.time() < nxt:
                yield SourceBatch([], int((nxt - self.every_s) * 1000))
                continue
            now = time.time()
            recs = [
                Record(None, {"k": i % 100, "sent": now}, int(now * 1000), f"p{n + i}")
                for i in range(int(self.rate * self.every_s))
            ]
            n += len(recs)
            nxt += self.every_s
            yield SourceBatch(recs, int(now * 1000))
        yield SourceBatch([], MAX_TIMESTAMP)


class PassA(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("a_out", {"sent": record.value["sent"]})


class PassB(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("b_out", {"a_id": record.id})


class ColPassA(ColumnarComputation):
    """``PassA`` as a columnar computation: one production per record, the batch's at once."""

    record_columns = ("key", "id", "timestamp", "value.sent")

    def process_batch(self, batch) -> None:
        r = batch.records
        sent = r["value.sent"].tolist()
        batch.produce(
            "a_out", [{"sent": x} for x in sent], keys=r["key"], timestamps=r["timestamp"]
        )


class ColPassB(ColumnarComputation):
    """``PassB`` as a columnar computation."""

    record_columns = ("key", "id", "timestamp")

    def process_batch(self, batch) -> None:
        r = batch.records
        batch.produce(
            "b_out",
            [{"a_id": i} for i in r["id"].tolist()],
            keys=r["key"],
            timestamps=r["timestamp"],
        )


def _batch_of(name: str) -> int:
    """The batch id in a published stream-log file's name (``b<batch>-...``)."""
    return int(name[1:11])


def stages(
    spark,
    work: Path,
    rate: int,
    seconds: float,
    intervals: int,
    writer: str = "auto",
    dedup: DedupOptions | None = None,
    columnar: str = "",
) -> dict:
    """One paced per-stage run; per stage its records (input visible, output visible, batch)
    and its query's progress reports (``_latency_floor.breakdown`` reads them). ``dedup``:
    both computations' dedup options (default: the defaults); ``columnar``: the two stages as
    columnar computations (``ColPassA``, ``ColPassB``) on that mapping (``default`` or
    ``arrow``) instead of per-record ones."""
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "stages"
    shutil.rmtree(root, ignore_errors=True)
    opts = ComputationOptions(
        **({} if dedup is None else {"dedup": dedup}),
        **({"mapping": columnar} if columnar else {}),
    )
    t = Topology("latency")
    t.injector("events", Paced(rate, seconds))
    a, b = (ColPassA, ColPassB) if columnar else (PassA, PassB)
    t.computation(
        a, inputs={"events": lambda r: r.value["k"]}, outputs=["a_out"], name="A", options=opts
    )
    t.computation(b, inputs={"a_out": lambda r: r.id}, outputs=["b_out"], name="B", options=opts)
    settings = RuntimeSettings(
        drain=True,
        intervals=intervals,
        poll_ms=20,
        heartbeat_ms=100,
        prune_streams=True,
        outbox_writer=writer,
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    polls: list[float] = []  # how long a round of the driver loop takes (publication waits for it)
    poll = rt.poll

    def timed_poll() -> None:
        t0 = time.perf_counter()
        poll()
        polls.append(time.perf_counter() - t0)

    rt.poll = timed_poll  # type: ignore[method-assign]
    with _sink_timing() as sinks:
        progress = run_collecting(rt, timeout_s=seconds + 900, poll_s=settings.poll_ms / 1000)
    pub = {
        **rt.computations["A"].outbox.published_at,
        **rt.computations["B"].outbox.published_at,
    }
    a_at: dict[str, float] = {}
    recs: dict[str, list[tuple[float, float, int]]] = {"A": [], "B": []}
    for (stream, name), at in pub.items():
        if stream == "a_out":
            for r in _rows(rt, "a_out", "A", name):
                a_at[r["id"]] = at
                recs["A"].append((pickle.loads(r["value"])["sent"], at, _batch_of(name)))
    for (stream, name), at in pub.items():
        if stream == "b_out":
            for r in _rows(rt, "b_out", "B", name):
                recs["B"].append((a_at[pickle.loads(r["value"])["a_id"]], at, _batch_of(name)))
    return {
        "records": recs,
        "progress": {"A": progress.get("A", {}), "B": progress.get("B", {})},
        "driver_poll_ms": {"p50": pct(polls, 50) * 1000, "p95": pct(polls, 95) * 1000},
        "sinks": {"A": sinks.get("A", {}), "B": sinks.get("B", {})},
        "run_ids": {
            stage: next(iter(p.values()))["runId"]
            for stage, p in (("A", progress.get("A")), ("B", progress.get("B")))
            if p
        },
    }


@contextlib.contextmanager
def _sink_timing():
    """Each outbox sink call's times (query -> batch -> (enter, collected, staged, exit)):
    the ``foreachBatch`` call of a batch, split at the collect of its rows and the staging write."""
    from millwheel.runtime import _outbox

    calls: dict[str, dict[int, list[float]]] = {}
    sink, stage = _outbox.Outbox.sink, _outbox.stage_arrow
    current = threading.local()

    def timed_sink(self, df, batch_id):
        current.times = times = [time.time(), 0.0, 0.0, 0.0]
        try:
            sink(self, df, batch_id)
        finally:
            times[3] = time.time()
            calls.setdefault(self.name, {})[batch_id] = times

    def timed_stage(table, target):
        times = getattr(current, "times", None)
        if times is not None:
            times[1] = time.time()
        stage(table, target)
        if times is not None:
            times[2] = time.time()

    _outbox.Outbox.sink, _outbox.stage_arrow = timed_sink, timed_stage
    try:
        yield calls
    finally:
        _outbox.Outbox.sink, _outbox.stage_arrow = sink, stage


def _sink_parts(
    progress: dict[int, dict], sinks: dict[int, list[float]], skip_before: float
) -> dict:
    """Medians over data batches, ms: addBatch's start to the sink's call (Spark's own work
    before it), the collect (the batch's whole job), the staging write, the sink's end to
    addBatch's end."""
    from _latency_floor import _ts

    parts: dict[str, list[float]] = {"before_sink": [], "collect": [], "stage": [], "after": []}
    for b, p in progress.items():
        t = sinks.get(b)
        if t is None or not read_input(p) or _ts(p["timestamp"]) < skip_before or not t[1]:
            continue
        d = p["durationMs"]
        start = _ts(p["timestamp"])
        add_start = (
            start
            + sum(d.get(k, 0) for k in ("latestOffset", "getBatch", "queryPlanning", "walCommit"))
            / 1000
        )
        add_end = add_start + d.get("addBatch", 0) / 1000
        parts["before_sink"].append((t[0] - add_start) * 1000)
        parts["collect"].append((t[1] - t[0]) * 1000)
        parts["stage"].append((t[2] - t[1]) * 1000)
        parts["after"].append((add_end - t[3]) * 1000)
    return {k: pct(v, 50) for k, v in parts.items()}


def _rows(rt, stream: str, producer: str, name: str) -> list[dict]:
    loc = rt.streams.location(stream, producer)
    path = loc.child(name)
    if not path.exists():
        path = loc.child("_done", name)  # pruned since
    return pq.read_table(path.path, columns=["id", "value"]).to_pylist()


# ---------------------------------------------------------------------------- zeitgeist
def _writer(truth: dict, staged: Path, live: Path, stop: threading.Event) -> None:
    """Append each file's lines evenly over its writing interval, in wall time."""
    for f in sorted(truth["files"], key=lambda f: f["written_from_ms"]):
        lines = (staged / f["name"]).read_text().splitlines(keepends=True)
        t0, t1 = f["written_from_ms"] / 1000, f["written_to_ms"] / 1000
        while time.time() < t0 and not stop.is_set():
            time.sleep(0.01)
        with open(live / f["name"], "a", encoding="utf-8") as fh:
            done = 0
            while done < len(lines) and not stop.is_set():
                due = (
                    len(lines)
                    if time.time() >= t1
                    else int(len(lines) * (time.time() - t0) / (t1 - t0))
                )
                if due > done:
                    fh.write("".join(lines[done:due]))
                    fh.flush()
                    done = due
                time.sleep(0.05)
    (live / "_DONE").write_text("")


def zeitgeist(spark, work: Path, duration_s: int, intervals: int, writer: str = "auto") -> dict:
    from millwheel import LogFileSource
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from topologies.zeitgeist import GeneratorConfig, ZeitgeistConfig, build, generate
    from topologies.zeitgeist.evaluation import RunResult, evaluate

    root = work / "zeitgeist"
    shutil.rmtree(root, ignore_errors=True)
    staged, live = root / "staged", root / "logs"
    live.mkdir(parents=True)
    gen = GeneratorConfig(
        seed=11,
        duration_s=duration_s,
        rate=400,
        queries=40,
        day_s=20,
        warmup_s=24,
        spikes=3,
        dips=3,
        anomaly_gap_s=4,
        start_ms=int(time.time() * 1000) + 60_000,
    )
    truth = generate(staged, gen)
    cfg = ZeitgeistConfig(day_ms=20_000, slot_ms=2_000)
    topology = build(
        staged,
        config=cfg,
        source=LogFileSource(live, lateness_ms=gen.max_delay_ms, idle_finish_ms=None),
    )
    settings = RuntimeSettings(
        intervals=intervals, poll_ms=20, heartbeat_ms=100, prune_streams=True, outbox_writer=writer
    )
    rt = SparkRuntime(topology, str(root / "run"), settings, spark=spark, log=lambda m: None)
    rt.start()  # before the first line is written: Spark's start-up is not in the figures
    stop = threading.Event()
    writer = threading.Thread(
        target=_writer, args=(truth, staged / "logs", live, stop), daemon=True
    )
    writer.start()
    progress: dict[str, dict[int, dict]] = {}
    try:
        deadline = time.monotonic() + 60 + duration_s + 900
        while not rt.drained() and time.monotonic() < deadline:
            rt.poll()
            collect(rt, progress)
            time.sleep(settings.poll_ms / 1000)
    finally:
        stop.set()
        collect(rt, progress)
        rt.stop()
    metrics = {name: dict(q.metrics) for name, q in rt.computations.items()}
    anomalies = [dict(v) for v in rt.values("anomalies")]
    report = evaluate(RunResult(anomalies, metrics, [], wall_clock=True, elapsed_s=0.0), truth)
    return {
        "duration_s": duration_s,
        "events": truth["events"],
        "by_kind": report["by_kind"],
        "batches": {name: progress_summary(p) for name, p in progress.items()},
    }


def slices(
    records: list[tuple[float, float, int]], progress: dict[int, dict], slice_s: float
) -> list[dict]:
    """A long run cut into ``slice_s`` slices of its input's send time: per slice, its data
    batches' ``triggerExecution`` p50, the stateful operator's state in memory (the largest
    ``memoryUsedBytes`` reported) and update time p50, and its records' latency p50."""
    from _latency_floor import _ts

    if not records:
        return []
    t0 = min(sent for sent, _, _ in records)
    by: dict[int, dict[str, list[float]]] = {}
    for sent, at, _ in records:
        by.setdefault(int((sent - t0) // slice_s), {}).setdefault("lat", []).append(at - sent)
    for p in progress.values():
        if not read_input(p):
            continue
        b = by.setdefault(int((_ts(p["timestamp"]) - t0) // slice_s), {})
        op = (p.get("stateOperators") or [{}])[0]
        b.setdefault("trigger", []).append(p["durationMs"]["triggerExecution"])
        b.setdefault("state", []).append(op.get("memoryUsedBytes", 0))
        b.setdefault("update", []).append(op.get("allUpdatesTimeMs", 0))
    return [
        {
            "from_s": k * slice_s,
            "batches": len(v.get("trigger", [])),
            "batch_ms_p50": pct(v.get("trigger", []), 50),
            "state_mb": round(max(v.get("state", [0])) / 1e6, 1),
            "update_ms_p50": pct(v.get("update", []), 50),
            "latency_s_p50": pct(v.get("lat", []), 50),
        }
        for k, v in sorted(by.items())
        if k >= 0
    ]


def steady(spark, work: Path, args) -> dict[str, list[dict]]:
    """One long run of millwheel's two stages and, if ``--floors`` names it, one of the native
    floor (``dropDuplicates``: a state-store row per id, kept), ``--steady-seconds`` each:
    how a batch's time follows the state held as it grows (:func:`slices`)."""
    dedup = (
        None
        if args.slack_s is None
        else DedupOptions(slack_ms=int(args.slack_s * 1000), gc_interval_ms=int(args.gc_s * 1000))
    )
    s = stages(spark, work, args.rate, args.steady_seconds, args.intervals, args.writer, dedup)
    out = {f"mw.{st}": slices(s["records"][st], s["progress"][st], args.slice_s) for st in "AB"}
    if "native" in args.floors.split(","):
        recs, progress, _, _ = floor(
            spark, work, "native", args.rate, args.steady_seconds, groups=args.intervals
        )
        out["floor.native"] = slices(recs, progress, args.slice_s)
    return out


def _measure(spark, work: Path, variant: str, args, cold: bool) -> dict[str, dict]:
    """One run of ``variant`` (``mw``: millwheel's two stages, per-record; ``mwcol``: the same as
    columnar computations; ``mwarrow``: those on the Arrow mapping; else a floor kind): figures
    per stage."""
    skip = 0.0 if cold else args.skip_s
    if variant in MW_KINDS:
        s = stages(
            spark,
            work,
            args.rate,
            args.seconds,
            args.intervals,
            args.writer,
            columnar={"mwcol": "default", "mwarrow": "arrow"}.get(variant, ""),
        )
        parts = {f"{variant}.{st}": (s["records"][st], s["progress"][st]) for st in ("A", "B")}
        run_ids = {f"{variant}.{st}": r for st, r in s["run_ids"].items()}
        extra = {"driver_poll_ms": s["driver_poll_ms"]}
        sink_of = {f"{variant}.{st}": s["sinks"][st] for st in ("A", "B")}
    else:
        recs, progress, run_id, sinks = floor(
            spark, work, variant, args.rate, args.seconds, groups=args.intervals
        )
        parts = {f"floor.{variant}": (recs, progress)}
        run_ids = {f"floor.{variant}": run_id}
        extra = {}
        sink_of = {f"floor.{variant}": sinks}
    out = {}
    stages_of = spark_stages(spark, run_ids) if args.ui else {}
    for name, (recs, progress) in parts.items():
        first = min((r[0] for r in recs), default=0.0)
        out[name] = {
            **breakdown(recs, batch_spans(progress), first + skip),
            "batches": progress_summary(progress, first + skip),
            "spark_stages": stages_of.get(name, {}),
            **extra,
        }
        if name in sink_of:
            out[name]["sink_ms"] = _sink_parts(progress, sink_of[name], first + skip)
    return out


def _line(name: str, f: dict) -> str:
    b = f["batches"]
    ms = lambda x: "-" if x is None else f"{x * 1000:.0f}"  # noqa: E731
    return (
        f"{name:13s} {f['records']:6d} rec  p50 {ms(f['p50_s']):>5s} ms  p95 {ms(f['p95_s']):>5s} ms  "
        f"(wait {ms(f['median_wait_s'])}, run {ms(f['median_run_s'])}, publish {ms(f['median_publish_s'])})  "
        f"batch p50 {b.get('trigger_ms_p50')} ms p95 {b.get('trigger_ms_p95')} ms, {b.get('rows_per_batch_p50')} rows; "
        f"parts {b.get('median_of_each_part_ms')}; operator {b.get('state_ms_p50')}"
        + (f"; stages {f['spark_stages']}" if f.get("spark_stages") else "")
        + (f"; driver poll {f['driver_poll_ms']}" if f.get("driver_poll_ms") else "")
        + (f"; sink {f['sink_ms']}" if f.get("sink_ms") else "")
    )


def _summary(runs: list[dict]) -> dict[str, dict]:
    """Per stage over the given runs: the median (and range) of the runs' p50 and p95, and the
    ratio of each millwheel stage's to the floors' (each run's own session)."""
    names = sorted({n for r in runs for n in r["figures"]})
    out: dict[str, dict] = {}
    for n in names:
        p50 = [r["figures"][n]["p50_s"] for r in runs if n in r["figures"]]
        p95 = [r["figures"][n]["p95_s"] for r in runs if n in r["figures"]]
        trig = [
            r["figures"][n]["batches"].get("trigger_ms_p50")
            for r in runs
            if n in r["figures"] and r["figures"][n]["batches"]
        ]
        med = statistics.median
        out[n] = {
            "runs": len(p50),
            "p50_s": med(p50) if p50 else None,
            "p50_s_range": [min(p50), max(p50)] if p50 else None,
            "p95_s": med(p95) if p95 else None,
            "p95_s_range": [min(p95), max(p95)] if p95 else None,
            "trigger_ms_p50": med([t for t in trig if t is not None]) if trig else None,
        }
    for n in names:
        if n.split(".")[0] in MW_KINDS:
            for f in names:
                if f.startswith("floor.") and out[f]["p50_s"]:
                    out[n][f"p50_x_{f}"] = round(out[n]["p50_s"] / out[f]["p50_s"], 2)
                    out[n][f"p95_x_{f}"] = round(out[n]["p95_s"] / out[f]["p95_s"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=2_000, help="records/s in the per-stage runs")
    p.add_argument("--seconds", type=float, default=40, help="each per-stage run's input, seconds")
    p.add_argument("--rounds", type=int, default=2, help="warm rounds after the warm-up round")
    p.add_argument("--skip-s", type=float, default=5.0, help="a warm run's first seconds left out")
    p.add_argument(
        "--floors",
        default=",".join(FLOOR_KINDS),
        help=f"floor queries run beside millwheel's stages ({','.join(FLOOR_KINDS)}; empty: none)",
    )
    p.add_argument(
        "--mw",
        default="mw",
        help="millwheel's variants of the two stages: mw (per-record), mwcol (columnar), mwarrow "
        "(columnar, Arrow mapping); comma-separated",
    )
    p.add_argument("--no-mw", action="store_true", help="the floors only")
    p.add_argument(
        "--intervals",
        type=int,
        default=None,
        help="key intervals per computation (default: the runtime's on the session's master, "
        "2 per core: 4 on local[2])",
    )
    p.add_argument(
        "--writer",
        default="auto",
        help="the outbox writer: auto, spark or driver (auto: the runtime's default)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    p.add_argument("--ui", action="store_true", help="Spark UI on: each query's Spark stages")
    p.add_argument("--zeitgeist-seconds", type=int, default=60, help="0 skips the Zeitgeist run")
    p.add_argument(
        "--steady-seconds",
        type=float,
        default=0,
        help="a long run of the two stages and the native floor after the rounds (0: none)",
    )
    p.add_argument("--slice-s", type=float, default=30.0, help="the long run's slices, seconds")
    p.add_argument(
        "--slack-s",
        type=float,
        default=None,
        help="the long run's dedup slack, seconds (default: DedupOptions' ten minutes)",
    )
    p.add_argument(
        "--gc-s", type=float, default=10.0, help="with --slack-s: the dedup collection interval"
    )
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench" / "latency"))
    p.add_argument("--out", default=str(RESULTS), help="results file")
    args = p.parse_args(argv)
    work = Path(args.work)
    from millwheel.runtime import default_intervals, spark_session

    spark = spark_session("local[2]", conf=dict(c.split("=", 1) for c in args.conf), ui=args.ui)
    if args.intervals is None:
        args.intervals = default_intervals(spark.sparkContext.master)
    mws = [m for m in args.mw.split(",") if m]
    if unknown := set(mws) - set(MW_KINDS):
        p.error(f"--mw: unknown {sorted(unknown)} (known: {', '.join(MW_KINDS)})")
    variants = ([] if args.no_mw else mws) + [f for f in args.floors.split(",") if f]
    out: dict = {"args": vars(args), "commit": git_head(ROOT) or "?", "runs": []}
    for rnd in range(args.rounds + 1 if variants else 0):  # none: the Zeitgeist run alone
        turn = rnd % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            figures = _measure(spark, work, variant, args, cold=rnd == 0)
            out["runs"].append({"round": rnd, "variant": variant, "figures": figures})
            for name, f in figures.items():
                print(f"round {rnd} {'cold' if rnd == 0 else 'warm'} " + _line(name, f), flush=True)
    out["cold"] = _summary([r for r in out["runs"] if r["round"] == 0])
    out["warm"] = _summary([r for r in out["runs"] if r["round"] > 0])
    for label in ("cold", "warm"):
        for name, f in out[label].items():
            ratios = {k: v for k, v in f.items() if "_x_" in k}
            print(
                f"{label} {name:13s} p50 {f['p50_s']:.3f} s {f['p50_s_range']}, p95 {f['p95_s']:.3f} s; "
                f"batch p50 {f['trigger_ms_p50']} ms {ratios}"
            )
    if args.steady_seconds:
        out["steady"] = st = steady(spark, work, args)
        for name, rows in st.items():
            for r in rows:
                print(
                    f"steady {name:13s} " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True
                )
    if args.zeitgeist_seconds:
        out["zeitgeist"] = z = zeitgeist(
            spark, work, args.zeitgeist_seconds, args.intervals, args.writer
        )
        for kind in ("dip", "spike"):
            k = z["by_kind"][kind]
            d = k.get("delay_beyond_bucket_end_ms", {})
            print(
                f"zeitgeist {kind}s: recall {k['recall']}, precision {k['precision']}; delay beyond bucket end p50 {d.get('p50')} ms, p95 {d.get('p95')} ms (n={d.get('n')})"
            )
        for name, b in z["batches"].items():
            print(
                f"  {name}: micro-batch p50 {b.get('trigger_ms_p50')} ms, p95 {b.get('trigger_ms_p95')} ms"
            )
    write_results(Path(args.out), out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
