"""Two low-watermark timers in a row, at low traffic (a command, not a test):
``python bench/timer_hop_bench.py``.

``events -> Windows -> Judge`` on local Spark (trigger 0, ``local[2]``): an injector paced at
``--rate`` records/s, a file every ``--every-s`` seconds (event time = wall time, the
injector's watermark the send time); ``Windows`` counts each key's records per second and
produces the count from a low-watermark timer at the second's end (§4.6); ``Judge`` keeps
each count and judges it from a low-watermark timer at the same end (as Zeitgeist's
``DipDetector`` does, §4.6 Fig. 9). The figure is a window's **delay**: from the end of its
second (wall time) to ``Judge``'s output for it becoming visible in the stream log. With
few records each query waits between batches: ``Judge`` plans a count file before its
driver has written the heartbeat that fires the timer the count sets, unless the producer
staged one beside it (``docs/runtime.md``, "A heartbeat before its producer publishes").

Run once per checkout and compare runs alternated by hand (``--out`` per run); the
results file keeps the commit, the machine's load and the delay percentiles.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
from _git import git_head  # noqa: E402
from _latency_floor import pct  # noqa: E402
from _spark_bench import write_results  # noqa: E402

from millwheel import MAX_TIMESTAMP, Computation, Record, Source, SourceBatch, Topology  # noqa: E402


class Paced(Source):
    """``rate`` records/s over ``keys`` keys, a batch every ``every_s``, for ``seconds``."""

    def __init__(self, rate: int, seconds: float, every_s: float, keys: int) -> None:
        self.rate, self.seconds, self.every_s, self.keys = rate, seconds, every_s, keys

    def batches(self, injector: str = "injector", stream: str = "records"):
        start = nxt = time.time()
        n = 0
        while time.time() - start < self.seconds:
            if time.time() < nxt:
                time.sleep(0.005)
                yield SourceBatch([], int((nxt - self.every_s) * 1000))
                continue
            now = time.time()
            recs = [
                Record(None, {"k": (n + i) % self.keys}, int(now * 1000), f"p{n + i}")
                for i in range(max(1, int(self.rate * self.every_s)))
            ]
            n += len(recs)
            nxt += self.every_s
            yield SourceBatch(recs, int(now * 1000))
        yield SourceBatch([], MAX_TIMESTAMP)


class Windows(Computation):
    def process_record(self, record: Record) -> None:
        second = record.timestamp // 1_000 * 1_000
        counts = self.state.get({})
        counts[second] = counts.get(second, 0) + 1
        self.state.set(counts)
        self.set_timer(str(second), second + 999)

    def process_timer(self, timer) -> None:
        counts = self.state.get({})
        second = timer.timestamp - 999
        self.produce("counts", {"k": self.key, "second": second, "n": counts.pop(second)})
        self.state.set(counts or None)


class Judge(Computation):
    def process_record(self, record: Record) -> None:
        second = record.value["second"]
        seen = self.state.get({})
        seen[second] = record.value["n"]
        self.state.set(seen)
        self.set_timer(str(second), second + 1_000)

    def process_timer(self, timer) -> None:
        seen = self.state.get({})
        second = timer.timestamp - 1_000
        self.produce("judged", {"second": second, "n": seen.pop(second)})
        self.state.set(seen or None)


def run(spark, work: Path, args) -> dict:
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "hop"
    shutil.rmtree(root, ignore_errors=True)
    t = Topology("timer-hop")
    t.injector("events", Paced(args.rate, args.seconds, args.every_s, args.keys))
    t.computation(Windows, inputs={"events": lambda r: r.value["k"]}, outputs=["counts"])
    t.computation(Judge, inputs={"counts": lambda r: r.value["k"]}, outputs=["judged"])
    settings = RuntimeSettings(
        drain=True, intervals=args.intervals, poll_ms=20, heartbeat_ms=100, prune_streams=True
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    rt.run(timeout_s=args.seconds + 600)
    query = rt.computations["Judge"]

    def delays(computation: str, stream: str) -> list[tuple[float, float]]:
        """(window end, seconds from it to the window's record visible) of each window."""
        loc = rt.streams.location(stream, computation)
        out = []
        for (s, name), at in rt.computations[computation].outbox.published_at.items():
            if s != stream:
                continue
            path = loc.child(name) if loc.child(name).exists() else loc.child("_done", name)
            for r in pq.read_table(path.path, columns=["value"]).to_pylist():
                end = (pickle.loads(r["value"])["second"] + 1_000) / 1000
                out.append((end, at - end))
        return out

    judged, counted = delays("Judge", "judged"), delays("Windows", "counts")
    first = min((end for end, _ in judged), default=0.0)
    warm = [d for end, d in judged if end - first >= args.skip_s]
    warm_counts = [d for end, d in counted if end - first >= args.skip_s]
    return {
        "windows": len(judged),
        "warm_windows": len(warm),
        "delay_s": {"p50": pct(warm, 50), "p95": pct(warm, 95), "max": max(warm, default=None)},
        "counted_delay_s": {"p50": pct(warm_counts, 50), "p95": pct(warm_counts, 95)},
        "batches": {"Windows": rt.computations["Windows"].batches, "Judge": query.batches},
        "late": query.metrics["late"],
        "timers_fired": query.metrics["timers_fired"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=20, help="records/s")
    p.add_argument("--every-s", type=float, default=1.0, help="seconds between injector files")
    p.add_argument("--keys", type=int, default=5)
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--skip-s", type=float, default=8, help="windows of the first seconds left out")
    p.add_argument("--intervals", type=int, default=2)
    p.add_argument("--work", default="/tmp/millwheel-timer-hop")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "timer_hop.json"))
    args = p.parse_args(argv)
    from millwheel.runtime import spark_session

    spark = spark_session("local[2]")
    out = run(spark, Path(args.work), args)
    d = out["delay_s"]
    print(
        f"two timers in a row: a window judged, visible p50 {d['p50']:.3f} s, p95 {d['p95']:.3f} s after its end "
        f"(counted: p50 {out['counted_delay_s']['p50']:.3f} s) "
        f"({out['warm_windows']} windows; batches {out['batches']}; late {out['late']})"
    )
    write_results(
        Path(args.out),
        {
            "what": f"bench/timer_hop_bench.py {' '.join(argv or sys.argv[1:])}".strip(),
            "commit": git_head(ROOT, dirty=True),
            "load_avg_at_end": list(os.getloadavg()),
            **out,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
