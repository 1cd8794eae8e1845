"""A driver process for the kill -9 tests: runs a small topology on local Spark until drained.

    python tests/runtime/crash_driver.py ROOT DATA_DIR {twostage|stamp} [--weak] [--dump FILE] [--follow]

``twostage``: JSON-lines logs -> WindowCounter (per query, 1 s buckets, low-watermark
timers) -> Tally (per bucket; one production per (bucket, query)). ``stamp``: a
computation whose productions depend on wall time and randomness (the case strong
productions exist for, MillWheel §6.1.2), then a consumer that deduplicates by id.
``MILLWHEEL_CRASH`` (see ``millwheel/runtime/_outbox.py``) kills it at an injected point.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from computations.windowing import WindowCounter  # noqa: E402
from millwheel import Computation, ComputationOptions, LogFileSource, Record, Topology  # noqa: E402
from millwheel.runtime import RuntimeSettings, SparkRuntime  # noqa: E402


class Tally(Computation):
    """Keyed by bucket: records each query's count and produces it once."""

    def process_record(self, record: Record) -> None:
        v = record.value
        counts = self.state.get({})
        counts[v["key"]] = v["count"]
        self.state.set(counts)
        self.produce(
            "tallies", {"window_start": v["window_start"], "key": v["key"], "count": v["count"]}
        )


class Stamp(Computation):
    """Non-deterministic: each production carries a random number and the wall time."""

    def process_record(self, record: Record) -> None:
        r = random.random()
        made = self.state.get({})
        made[record.id] = r
        self.state.set(made)
        self.produce("stamps", {"src": record.id, "rand": r, "wall_ns": time.time_ns()})


class CountBySource(Computation):
    """Consumer of stamps: how many times each source record's stamp arrived (after dedup)."""

    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


def build(
    kind: str,
    data: str,
    weak: bool,
    max_bytes: int = 64 << 20,
    *,
    columnar: bool = False,
    arrow: bool = False,
    finite: bool = True,
) -> Topology:
    """``finite=False``: the log directory is complete once ``_DONE`` appears (a test writes its input while the run goes on)."""
    t = Topology(kind)
    t.injector("queries", LogFileSource(data, finite=finite, max_bytes_per_batch=max_bytes))
    if kind == "twostage":
        counter = WindowCounter
        if (
            columnar or arrow
        ):  # the same count on the columnar path (``millwheel/_columnar.py``), under the same name
            from computations.columnar_windowing import ColumnarWindowCounter

            counter = ColumnarWindowCounter
        # ``arrow``: on the opt-in Arrow mapping (``millwheel/runtime/plans/arrow.py``)
        opts = dataclasses.replace(counter.options, mapping="arrow") if arrow else None
        t.computation(
            counter,
            name="WindowCounter",
            inputs={"queries": lambda r: r.value["query"]},
            outputs=["window_counts"],
            options=opts,
            params={"trailing_empty": 0},
        )
        t.computation(
            Tally, inputs={"window_counts": lambda r: r.value["window_start"]}, outputs=["tallies"]
        )
    else:
        opts = ComputationOptions(strong_productions=not weak)
        t.computation(
            Stamp, inputs={"queries": lambda r: r.value["query"]}, outputs=["stamps"], options=opts
        )
        t.computation(CountBySource, inputs={"stamps": lambda r: r.value["src"]})
    return t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("data")
    p.add_argument("kind", choices=["twostage", "stamp"])
    p.add_argument("--weak", action="store_true")
    p.add_argument("--columnar", action="store_true", help="twostage: the columnar WindowCounter")
    p.add_argument(
        "--arrow",
        action="store_true",
        help="twostage: the columnar WindowCounter on the Arrow mapping",
    )
    p.add_argument("--dump")
    p.add_argument(
        "--follow",
        action="store_true",
        help="the log directory is complete once _DONE appears (the test writes input meanwhile)",
    )
    p.add_argument("--intervals", type=int, default=4)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--max-bytes", type=int, default=64 << 20, help="log bytes per injector batch")
    p.add_argument(
        "--per-trigger", type=int, default=None, help="stream files per computation batch"
    )
    args = p.parse_args()
    topo = build(
        args.kind,
        args.data,
        args.weak,
        args.max_bytes,
        columnar=args.columnar,
        arrow=args.arrow,
        finite=not args.follow,
    )
    settings = RuntimeSettings(
        # ``drain`` reads a log directory as complete (``_injectors.LogFileInjector``): with
        # ``--follow`` a file appended after the injector read every file would come under
        # its +inf watermark, late; ``_DONE`` ends the followed input instead
        drain=not args.follow,
        intervals=args.intervals,
        master="local[2]",
        max_files_per_trigger=args.per_trigger,
    )
    rt = SparkRuntime(topo, args.root, settings, log=lambda m: print(m, flush=True))
    rt.run(timeout_s=args.timeout)
    if args.dump:
        states = {name: rt.states(name) for name in topo.computations}
        with open(args.dump, "wb") as f:
            pickle.dump(states, f)
    print("DRAINED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
