"""Where the Python worker's time goes, without Spark (a command, not a test).

    .venv/bin/python bench/worker_profile.py [--records 1000000] [--profile]

Runs the two Python stages of the windowed count of ``bench/runtime_bench.py`` on the same
data, in one process: keying (the ``mapInArrow`` function, on Arrow batches as Spark hands
them over) and the per-interval step (``IntervalStep``, the default layout, on pandas
frames grouped by key interval, state carried from batch to batch), 10 batches, 16 key
intervals. It reports CPU seconds per stage and per record; ``--profile`` adds a cProfile
of both, sorted by own time. What Spark adds around these (reading files, the shuffle,
Arrow transfers, the state store, the outbox) is the difference from the Spark run's
time in ``bench/runtime_bench.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from runtime_bench import WINDOW, WindowCount, make_data  # noqa: E402

from millwheel import Topology  # noqa: E402
from millwheel.runtime._interval import IntervalStep, make_key_extractor  # noqa: E402
from millwheel.runtime._wire import to_spark  # noqa: E402


class _State:
    """The GroupState surface ``IntervalStep`` uses, in memory."""

    def __init__(self) -> None:
        self.value = None
        self.watermark = 0
        self.timeout = None

    exists = property(lambda self: self.value is not None)
    get = property(lambda self: self.value)

    def update(self, v) -> None:
        self.value = v

    def remove(self) -> None:
        self.value = None

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 - Spark's name
        return self.watermark

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        return 0

    def setTimeoutTimestamp(self, t: int) -> None:  # noqa: N802
        self.timeout = t


def run(files: list[Path], intervals: int) -> dict[str, float]:
    t = Topology("bench")
    t.injector("events", _finished())
    t.computation(WindowCount, inputs={"events": lambda r: r.value["query"]}, outputs=["counts"])
    spec = t.validate().computations["WindowCount"]
    extract = make_key_extractor("WindowCount", "events", spec.inputs["events"], intervals)
    step = IntervalStep(spec)
    states = [_State() for _ in range(intervals)]
    per_batch = max(1, len(files) // 10)
    keying = stepping = 0.0
    records = 0
    wm = 0
    for b in range(0, len(files), per_batch):
        batch = []
        for f in files[b : b + per_batch]:
            table = pq.read_table(f, columns=["id", "ts", "key", "value", "wm"])
            n = table.num_rows
            table = table.append_column("src", pa.array([f.name] * n, pa.string())).append_column("row", pa.array(range(n), pa.int64()))
            batch += table.to_batches()
        records += sum(x.num_rows for x in batch)
        c0 = time.process_time()
        keyed = pa.Table.from_batches(list(extract(iter(batch)))).to_pandas()
        c1 = time.process_time()
        for iv, frame in keyed.groupby("interval"):
            st = states[int(iv)]
            st.watermark = wm
            for _ in step((iv,), iter([frame]), st):
                pass
        c2 = time.process_time()
        keying += c1 - c0
        stepping += c2 - c1
        newest = int(keyed["ts"].max())
        wm = to_spark(newest // WINDOW * WINDOW - 1)
    state_bytes = sum(len(a) + len(b) for a, b in (st.value for st in states if st.value is not None))
    return {"records": records, "keying_cpu_s": keying, "step_cpu_s": stepping, "state_bytes": state_bytes}


def _finished():
    from _spark_bench import Finished

    return Finished()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--intervals", type=int, default=16)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    args = p.parse_args(argv)
    work = Path(args.work) / f"{args.records}-{args.keys}-{args.files}"
    files = sorted(f for f in make_data(work, args.records, args.keys, args.files).iterdir() if f.suffix == ".parquet")
    if args.profile:
        prof = cProfile.Profile()
        r = prof.runcall(run, files, args.intervals)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        r = run(files, args.intervals)
    n = r["records"]
    print(f"{n:,} records: keying {r['keying_cpu_s']:.2f} CPU s ({r['keying_cpu_s'] / n * 1e6:.2f} us a record), "
          f"step stage {r['step_cpu_s']:.2f} CPU s ({r['step_cpu_s'] / n * 1e6:.2f} us a record); "
          f"interval state rows at the end {r['state_bytes'] / 1e6:.1f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
