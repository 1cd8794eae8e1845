"""Where the Python worker's time goes, without Spark (a command, not a test).

    .venv/bin/python bench/worker_profile.py [--records 1000000] [--profile]

Runs the Python work of the windowed count of ``bench/runtime_bench.py`` on the same data,
in one process, 10 batches, 16 key intervals:

* the consumer's one Python stage, the per-interval step (``IntervalStep``, the default
  layout, on pandas frames grouped by key interval, state carried from batch to batch),
  fed as Spark feeds it: key and interval taken from the producer's ``key:C`` /
  ``interval:C`` columns (``millwheel/runtime/_keying.py``) with Arrow, no Python per row,
  as the consumer's keying function passes them through;
* what keying costs where it happens: the producer's (:class:`Keyer` on records whose
  values it has in hand) and, for comparison, the consumer's own keying pass
  (``make_keying``, what rows not keyed for it still pay: it decodes each value).

It reports CPU seconds per part and per record; ``--profile`` adds a cProfile of the step
stage, sorted by own time. What Spark adds around these (reading files, the shuffle, Arrow
transfers, the state store, the outbox) is the difference from the Spark run's time in
``bench/runtime_bench.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from runtime_bench import WINDOW, WindowCount, _query, make_data  # noqa: E402

from millwheel import Record, Topology  # noqa: E402
from millwheel._codec import decode_value  # noqa: E402
from millwheel.runtime._interval import MemoryGroupState, make_keying  # noqa: E402
from millwheel.runtime._keying import Keyer, key_columns  # noqa: E402
from millwheel.runtime._wire import to_spark  # noqa: E402
from millwheel.runtime.plans.intervals import IntervalStep  # noqa: E402


def _keyed_frame(table: pa.Table) -> pa.Table:
    """What the consumer's query hands its step for producer-keyed rows: the producer's key
    columns, taken in the JVM (``_query.ComputationQuery._keyed``), renamed and added with Arrow."""
    kcol, icol = key_columns("WindowCount")
    n = table.num_rows
    return pa.table(
        {
            "interval": table.column(icol),
            "kind": pa.array([0] * n, pa.int32()),
            "key": table.column(kcol),
            "id": table.column("id"),
            "ts": table.column("ts"),
            "value": table.column("value"),
            "wm": table.column("wm"),
            "stream": pa.array(["events"] * n, pa.string()),
            "src": table.column("src"),
            "row": table.column("row"),
            "now": pa.nulls(n, pa.int64()),
        }
    )


def run(
    files: list[Path],
    intervals: int,
    profile: cProfile.Profile | None = None,
    columnar: bool = False,
    arrow: str | None = None,
) -> dict[str, float]:
    t = Topology("bench")
    t.injector("events", _finished())
    if columnar:
        from computations.columnar_windowing import ColumnarWindowCounter

        params = {"window_ms": WINDOW, "output": "counts", "trailing_empty": 0}
        t.computation(
            ColumnarWindowCounter,
            name="WindowCount",
            inputs={"events": _query},
            outputs=["counts"],
            params=params,
        )
    else:
        t.computation(WindowCount, inputs={"events": _query}, outputs=["counts"])
    spec = t.validate().computations["WindowCount"]
    key = make_keying("WindowCount", "events", spec.inputs["events"], intervals)
    keyer = Keyer.of(t, intervals)
    if columnar:
        from millwheel.runtime._columnar import ColumnarIntervalStep

        step: IntervalStep = ColumnarIntervalStep(spec)
    else:
        step = IntervalStep(spec)
    states = [MemoryGroupState() for _ in range(intervals)]
    arrow_run = _ArrowRun(step, arrow, intervals) if arrow is not None else None  # type: ignore[arg-type]
    per_batch = max(1, len(files) // 10)
    consumer_keying = producer_keying = stepping = 0.0
    records = 0
    wm = 0
    for b in range(0, len(files), per_batch):
        batch = []
        for f in files[b : b + per_batch]:
            table = pq.read_table(f)
            n = table.num_rows
            table = table.append_column("src", pa.array([f.name] * n, pa.string())).append_column(
                "row", pa.array(range(n), pa.int64())
            )
            batch.append(table)
        table = pa.concat_tables(batch)
        records += table.num_rows
        # keying, where it happens (for the record; the step below does not use these)
        c0 = time.process_time()
        for rb in table.to_batches():
            key(
                pa.repeat(True, rb.num_rows),
                rb.column("id"),
                rb.column("ts"),
                rb.column("key"),
                rb.column("value"),
                pa.nulls(rb.num_rows, pa.struct([])),
            )
        c1 = time.process_time()
        recs = [
            ("events", Record(None, decode_value(v), 0, ""))
            for v in table.column("value").to_pylist()
        ]
        c2 = time.process_time()
        keyer.rows(recs, ["WindowCount"])
        c3 = time.process_time()
        consumer_keying += c1 - c0
        producer_keying += c3 - c2
        # the consumer's one Python stage on producer-keyed rows
        c4 = time.process_time()
        if profile is not None:
            profile.enable()
        if arrow_run is not None:
            arrow_run.batch(_keyed_frame(table), wm)
        else:
            keyed = _keyed_frame(table).to_pandas()
            for iv, frame in keyed.groupby("interval"):
                st = states[int(iv)]
                st.watermark = wm
                for _ in step((iv,), iter([frame]), st):
                    pass
        if profile is not None:
            profile.disable()
        stepping += time.process_time() - c4
        newest = int(pc.max(table.column("ts")).as_py())
        wm = to_spark(newest // WINDOW * WINDOW - 1)
    state_bytes = sum(
        len(a) + len(b) for a, b in (st.value for st in states if st.value is not None)
    )
    if arrow_run is not None:
        state_bytes = arrow_run.state_bytes()
    return {
        "records": records,
        "consumer_keying_cpu_s": consumer_keying,
        "producer_keying_cpu_s": producer_keying,
        "step_cpu_s": stepping,
        "state_bytes": state_bytes,
    }


class _ArrowRun:
    """The Arrow mapping's task (``millwheel/runtime/_arrowmap.py``) over the same batches: one
    partition holding every interval, store files in ``root``, the manifest kept here as the
    driver keeps it."""

    def __init__(self, step, root: str, intervals: int) -> None:
        from millwheel.runtime._colfiles import Manifest

        self.step, self.root, self.manifest = step, root, Manifest()
        step.groups = list(range(intervals))
        step._interval_of = {g: g for g in step.groups}
        self.n = 0

    def batch(self, keyed: pa.Table, wm: int) -> None:
        from millwheel.runtime._wire import SUMMARY_STREAM, IntervalSummary, from_spark
        from millwheel.runtime.plans.arrow import BatchPlan, IntervalTask

        table = keyed.rename_columns(["group", *keyed.column_names[1:]])
        lw = from_spark(wm)
        plan = BatchPlan(
            self.n,
            "prof",
            lw,
            0,
            self.manifest.low_watermark,
            1,
            dict(self.manifest.files),
            tuple(self.manifest.due(lw, 0)),
            self.root,
        )
        reports = []
        for rb in IntervalTask(self.step, plan)(iter(table.to_batches())):
            for stream, name, value in zip(
                rb.column("stream").to_pylist(),
                rb.column("id").to_pylist(),
                rb.column("value").to_pylist(),
                strict=True,
            ):
                if stream == SUMMARY_STREAM:
                    s = IntervalSummary.decode(value)
                    reports.append(
                        (s.interval, name, s.next_low_watermark_timer, s.next_wall_timer)
                    )
        self.manifest = self.manifest.after(self.n, lw, reports)
        self.n += 1

    def state_bytes(self) -> int:
        return sum(
            os.path.getsize(f"{self.root}/i{i}/{name}") for i, name in self.manifest.files.items()
        )


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
    p.add_argument(
        "--columnar",
        action="store_true",
        help="the columnar windowed count (ColumnarWindowCounter) instead",
    )
    p.add_argument(
        "--arrow",
        action="store_true",
        help="--columnar on the Arrow mapping's task (store files in a temporary directory)",
    )
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    args = p.parse_args(argv)
    work = Path(args.work) / f"{args.records}-{args.keys}-{args.files}"
    keyed, _ = make_data(work, args.records, args.keys, args.files, args.intervals)
    files = sorted(f for f in keyed.iterdir() if f.suffix == ".parquet")
    prof = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as tmp:
        r = run(
            files,
            args.intervals,
            prof,
            columnar=args.columnar or args.arrow,
            arrow=tmp if args.arrow else None,
        )
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    n = r["records"]
    us = {k: r[f"{k}_cpu_s"] / n * 1e6 for k in ("step", "producer_keying", "consumer_keying")}
    print(
        f"{n:,} records: the consumer's step stage {r['step_cpu_s']:.2f} CPU s ({us['step']:.2f} us a record); "
        f"keying at the producer {us['producer_keying']:.2f} us a record (the consumer's own keying pass, for unkeyed rows: "
        f"{us['consumer_keying']:.2f} us a record); interval state rows at the end {r['state_bytes'] / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
