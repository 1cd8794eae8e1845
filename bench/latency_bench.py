"""Latency benchmark on Spark (a command, not a test): ``python bench/latency_bench.py``.

Two continuous-mode runs (trigger 0, ``local[2]``, streams pruned):

1. **Per-stage latency.** An injector paced at ``--rate`` records/s for ``--seconds``
   feeds ``PassA -> B`` (each produces one record per input). A stage's latency is the
   time from its input becoming visible (injector send time; ``PassA``'s publication) to
   its output becoming visible in the stream log (the outbox publication after the
   commit). Also: each query's micro-batch time (Spark's ``triggerExecution``, median and
   p95, with the parts of the median batch), the profile of what a stage waits for.
2. **Zeitgeist, paced.** The generator writes a sample whose event time is wall time; a
   writer thread appends each file's lines while its writing interval passes, as a
   logger would; the topology reads the growing directory. The dip (and spike) delay is
   ``detected_at - window end`` of each matched anomaly (``docs/zeitgeist.md``), end to
   end: log line written -> four queries -> anomaly visible.

Figures go to stdout and ``bench/results/latency.json``.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
from _spark_bench import collect, run_collecting, write_results  # noqa: E402

from millwheel import MAX_TIMESTAMP, Computation, Record, Source, SourceBatch, Topology  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "latency.json"


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s))) - 1))]


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


def _batches(progress: dict[int, dict]) -> dict:
    ps = [p for p in progress.values() if p["numInputRows"] > 0]
    times = [p["durationMs"]["triggerExecution"] for p in ps]
    if not ps:
        return {}
    median = sorted(ps, key=lambda p: p["durationMs"]["triggerExecution"])[len(ps) // 2][
        "durationMs"
    ]
    return {
        "data_batches": len(ps),
        "trigger_ms_p50": pct(times, 50),
        "trigger_ms_p95": pct(times, 95),
        "median_batch_parts_ms": median,
    }


def stages(
    spark, work: Path, rate: int, seconds: float, intervals: int, writer: str = "auto"
) -> dict:
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "stages"
    shutil.rmtree(root, ignore_errors=True)
    t = Topology("latency")
    t.injector("events", Paced(rate, seconds))
    t.computation(PassA, inputs={"events": lambda r: r.value["k"]}, outputs=["a_out"])
    t.computation(PassB, inputs={"a_out": lambda r: r.id}, outputs=["b_out"], name="B")
    settings = RuntimeSettings(
        drain=True,
        intervals=intervals,
        poll_ms=20,
        heartbeat_ms=100,
        prune_streams=True,
        outbox_writer=writer,
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    progress = run_collecting(rt, timeout_s=seconds + 900, poll_s=settings.poll_ms / 1000)
    pub = {
        **rt.computations["PassA"].outbox.published_at,
        **rt.computations["B"].outbox.published_at,
    }
    a_at: dict[str, float] = {}
    lat_a, lat_b = [], []
    for (stream, name), at in pub.items():
        if stream == "a_out":
            for r in _rows(rt, "a_out", "PassA", name):
                a_at[r["id"]] = at
                lat_a.append(at - pickle.loads(r["value"])["sent"])
    for (stream, name), at in pub.items():
        if stream == "b_out":
            for r in _rows(rt, "b_out", "B", name):
                lat_b.append(at - a_at[pickle.loads(r["value"])["a_id"]])
    return {
        "rate": rate,
        "seconds": seconds,
        "intervals": intervals,
        "outbox_writer": writer,
        "A": {
            "records": len(lat_a),
            "p50_s": pct(lat_a, 50),
            "p95_s": pct(lat_a, 95),
            "batches": _batches(progress.get("PassA", {})),
        },
        "B": {
            "records": len(lat_b),
            "p50_s": pct(lat_b, 50),
            "p95_s": pct(lat_b, 95),
            "batches": _batches(progress.get("B", {})),
        },
    }


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
        "batches": {name: _batches(p) for name, p in progress.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=2_000, help="records/s in the per-stage run")
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument(
        "--intervals",
        default="8",
        help="key intervals per computation; a comma list runs the per-stage run once per count, in turn (same session)",
    )
    p.add_argument(
        "--writers",
        default="auto",
        help="outbox writers to run the per-stage run with, in turn (same session): auto,spark,driver (auto: the runtime's default)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    p.add_argument("--zeitgeist-seconds", type=int, default=60, help="0 skips the Zeitgeist run")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench" / "latency"))
    p.add_argument("--out", default=str(RESULTS), help="results file")
    args = p.parse_args(argv)
    work = Path(args.work)
    from millwheel.runtime import spark_session

    spark = spark_session("local[2]", conf=dict(c.split("=", 1) for c in args.conf))
    out: dict = {"args": vars(args)}
    writers = args.writers.split(",")
    counts = [int(n) for n in args.intervals.split(",")]
    out["by_writer"], out["runs"] = {}, []
    for writer, intervals in [(w, n) for w in writers for n in counts]:
        out["by_writer"][writer] = s = stages(
            spark, work, args.rate, args.seconds, intervals, writer
        )
        out["runs"].append(s)
        for stage in ("A", "B"):
            b = s[stage]["batches"]
            print(
                f"outbox writer {writer}, {intervals} intervals, stage {stage}: {s[stage]['records']} records at {args.rate}/s: latency p50 {s[stage]['p50_s']:.2f} s, p95 {s[stage]['p95_s']:.2f} s; "
                f"micro-batch p50 {b.get('trigger_ms_p50')} ms, p95 {b.get('trigger_ms_p95')} ms; median batch {b.get('median_batch_parts_ms')}",
                flush=True,
            )
    out["stages"] = out["by_writer"][writers[-1]]
    if args.zeitgeist_seconds:
        out["zeitgeist"] = z = zeitgeist(
            spark, work, args.zeitgeist_seconds, counts[-1], writers[-1]
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
