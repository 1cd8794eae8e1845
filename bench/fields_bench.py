"""Declared fields vs pickled values, side by side in one run (a command, not a test).

    .venv/bin/python bench/fields_bench.py [--records 400000] [--keys 2000] [--files 40] [--reps 2]

A columnar windowed sum of one field (``ColumnarWindowAggregate(aggregate="sum",
field="ms")``, exactly-once + strong, 10 s windows) over the same records
``{"query": str, "ts": int, "ms": float}``, stored two ways in the stream-log files:

* ``pickled``: the stream does not declare its fields, every value is pickled (what every
  stream was before); the computation's ``value.ms`` column is taken from each decoded value;
* ``fields``: the stream declares them (``Topology.stream(..., fields=...)``): the files
  hold the values in a ``fields`` struct column, ``value`` is null, the query carries
  ``ms`` only and nothing is unpickled.

Both on the default mapping and on the Arrow mapping (``_arrow``). The files are written
by the production writer (``records_table`` with the run's ``Keyer``), keyed for the
consumer as its producer would. Each variant's output is checked against a pandas answer.
Figures go to stdout and ``bench/results/fields.json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
from _spark_bench import Finished, data_args, link_stream, run_collecting, write_results  # noqa: E402

from millwheel import ComputationOptions, Record, Topology  # noqa: E402
from millwheel._fields import StreamFields  # noqa: E402

WINDOW = 10_000
START = 1_700_000_000_000
FIELDS = {"query": str, "ts": int, "ms": float}
RESULTS = ROOT / "bench" / "results" / "fields.json"


def _query(r: Record) -> str:
    return r.value["query"]


def make_data(d: Path, records: int, keys: int, files: int) -> dict[str, Path]:
    """The same records written undeclared (``pickled``) and declared (``fields``)."""
    import numpy as np

    from millwheel.runtime._keying import Keyer
    from millwheel.runtime._streams import records_table

    out = {"pickled": d / "pickled", "fields": d / "fields"}
    if all((p / "_READY").exists() for p in out.values()):
        return out
    rng = np.random.default_rng(7)
    per = records // files
    span = 100_000
    keyers = {
        "pickled": Keyer({"events": [("Agg", _query)]}, 16),
        "fields": Keyer(
            {"events": [("Agg", _query)]}, 16, fields={"events": StreamFields.of(FIELDS)}
        ),
    }
    for p in out.values():
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
    for f in range(files):
        lo = START + f * span // files
        ts = np.sort(lo + rng.integers(0, span // files, per)).tolist()
        qs = rng.integers(0, keys, per).tolist()
        ms = (rng.integers(0, 80_000, per) / 8).tolist()
        recs = [
            Record(None, {"query": f"q{q}", "ts": t, "ms": m}, t, f"r{f}-{i}")
            for i, (q, t, m) in enumerate(zip(qs, ts, ms, strict=True))
        ]
        for how, keyer in keyers.items():
            pq.write_table(
                records_table(recs, None, keyer, "events"), out[how] / f"f{f:05d}-m{ts[0]}.parquet"
            )
    for p in out.values():
        (p / "_READY").write_text("")
    return out


def expected(files: Path) -> dict[tuple[str, int], float]:
    """The plain answer: the sum of ``ms`` per query and window, with pandas."""
    import pandas as pd

    from millwheel.runtime._fs import Location
    from millwheel.runtime._streams import read_log, table_records

    recs = [
        r
        for f in sorted(files.glob("*.parquet"))
        for r in table_records(read_log(Location.of(str(f))))
    ]
    df = pd.DataFrame(
        {
            "q": [r.value["query"] for r in recs],
            "w": [r.timestamp // WINDOW * WINDOW for r in recs],
            "ms": [r.value["ms"] for r in recs],
        }
    )
    return {(q, int(w)): float(s) for (q, w), s in df.groupby(["q", "w"])["ms"].sum().items()}


def decode_costs(data: dict[str, Path]) -> dict[str, float]:
    """In process, µs per record: what a worker pays to get each record's value (unpickle
    it, or build the dict from the struct column as PySpark does) and its ``ms`` field."""
    import pickle

    import pyarrow.compute as pc

    from millwheel._fields import field_column

    p = (
        pq.read_table(sorted(data["pickled"].glob("*.parquet"))[0], columns=["value"])
        .column("value")
        .to_pylist()
    )
    f = pq.read_table(sorted(data["fields"].glob("*.parquet"))[0], columns=["fields"]).column(
        "fields"
    )
    n = len(p)
    out = {}
    for name, fn in {
        "unpickle_value": lambda: [pickle.loads(v) for v in p],
        "struct_to_dicts": lambda: f.to_pylist(),
        "value_ms_from_dicts": lambda: field_column(f.to_pylist(), "ms", float),
        "value_ms_from_pickled": lambda: field_column([pickle.loads(v) for v in p], "ms", float),
        "arrow_child_column": lambda: pc.struct_field(f, "ms").to_numpy(),
    }.items():
        best = min(_timed(fn) for _ in range(5))
        out[name] = round(best / n * 1e6, 3)
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(
    spark, files: Path, work: Path, declared: bool, mapping: str, per_trigger: int, intervals: int
) -> tuple[float, dict]:
    from computations.columnar_windowing import ColumnarWindowAggregate
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    root = work / "run"
    link_stream(files, root, "events", "events")
    t = Topology("fields_bench")
    t.injector("events", Finished())
    if declared:
        t.stream("events", fields=FIELDS)
    t.computation(
        ColumnarWindowAggregate,
        name="Agg",
        inputs={"events": _query},
        outputs=["sums"],
        options=ComputationOptions(mapping=mapping),
        params={"aggregate": "sum", "field": "ms", "window_ms": WINDOW, "output": "sums"},
    )
    settings = RuntimeSettings(
        drain=True,
        intervals=intervals,
        max_files_per_trigger=per_trigger,
        poll_ms=50,
        heartbeat_ms=100,
    )
    rt = SparkRuntime(t, str(root), settings, spark=spark, log=lambda m: None)
    started = time.perf_counter()
    run_collecting(rt, timeout_s=1800, poll_s=0.05)
    elapsed = time.perf_counter() - started
    return elapsed, {(v["key"], v["window_start"]): v["sum"] for v in rt.values("sums")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_args(p, records=400_000, keys=2_000, files=40)
    p.add_argument("--variants", default="pickled,fields,pickled_arrow,fields_arrow")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    work = Path(args.work) / f"fields-{args.records}-{args.keys}-{args.files}"
    data = make_data(work, args.records, args.keys, args.files)
    answer = expected(data["pickled"])
    decode = decode_costs(data)
    print(
        "in process, µs per record: " + ", ".join(f"{k} {v}" for k, v in decode.items()), flush=True
    )
    from millwheel.runtime import spark_session

    spark = spark_session("local[2]")
    variants = args.variants.split(",")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(args.reps + 1):
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        for v in order:
            how, _, mapping = v.partition("_")
            elapsed, got = run(
                spark,
                data[how],
                work,
                how == "fields",
                mapping or "default",
                args.per_trigger,
                args.intervals,
            )
            ok = got.keys() == answer.keys() and all(
                abs(got[k] - answer[k]) <= 1e-9 * max(1.0, abs(answer[k])) for k in answer
            )
            print(
                f"rep {rep}{' (warm-up, discarded)' if rep == 0 else ''}: {v:<14} {elapsed:7.2f}s  {args.records / elapsed:>10,.0f} rec/s  output {'OK' if ok else 'DIFFERS'}",
                flush=True,
            )
            if not ok:
                return 1
            if rep:
                times[v].append(elapsed)
    rates = {v: args.records / statistics.median(ts) for v, ts in times.items()}
    lines = ["| variant | median records/s | vs pickled (same mapping) |", "|---|---:|---:|"]
    for v in variants:
        base = "pickled" + v[len(v.partition("_")[0]) :]
        rel = (
            statistics.median(tb / ta for ta, tb in zip(times[v], times[base], strict=True))
            if base in times
            else float("nan")
        )
        lines.append(f"| {v} | {rates[v]:,.0f} | {rel:.2f}x |")
    sizes = {how: sum(f.stat().st_size for f in d.glob("*.parquet")) for how, d in data.items()}
    lines.append("")
    lines.append(f"stream-log bytes: pickled {sizes['pickled']:,}, fields {sizes['fields']:,}")
    print("\n".join(lines))
    write_results(
        Path(args.out),
        {
            "args": vars(args),
            "seconds": times,
            "records_per_s": {v: round(r) for v, r in rates.items()},
            "bytes": sizes,
            "decode_us_per_record": decode,
            "table": lines,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
