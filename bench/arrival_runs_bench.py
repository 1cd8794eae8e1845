"""A columnar batch of many arrival watermarks, side by side with another checkout (a command, not a test).

    .venv/bin/python bench/arrival_runs_bench.py                          # this checkout alone
    .venv/bin/python bench/arrival_runs_bench.py --compare /path/to/old   # and another, alternated

A micro-batch that reads the files of many upstream batches (a backlog, a restart, a busy
stage) holds records that arrived under many low watermarks; under a batch watermark above
them the columnar runner takes them as the per-key step does, a call per run of one
arrival watermark (``millwheel/_colruns.py``). This times one key interval's task on the
Arrow mapping (``plans/arrow.IntervalTask``, in process) over ``--records`` records of
``--keys`` keys (``--skew``) in ``F`` files (each file's records a second of event time, ``--disorder-ms``
out of order, sent under the watermark before the file, as a log injector sends them),
with ``ColumnarWindowCounter`` as the main job runs it (1 s windows, 10 trailing empty
ones), under the watermark before the records (one call, nothing fires) and under +inf
(every call, every timer): there every window's count must equal a plain count of the
records (none is late: each file's watermark trails its records by the disorder). Each
checkout in a fresh process per pass, ``--reps`` passes, alternated; the productions'
digest must agree. Prints the medians; writes
``bench/results/arrival_runs_<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _git import git_head

ROOT = Path(__file__).resolve().parent.parent

#: one pass in the checkout on PYTHONPATH: seconds of the task under each watermark, and a
#: digest of the productions under +inf
PASS = """
import hashlib, json, random, sys, tempfile, time
import pyarrow as pa
from computations.columnar_windowing import ColumnarWindowCounter
from millwheel import MAX_TIMESTAMP, ComputationOptions, SampleSource, Topology
from collections import Counter
from millwheel._codec import decode_value, encode_value
from millwheel._record import encode_key
from millwheel.runtime._colfiles import ColumnarFiles, Manifest
from millwheel.runtime._columnar import ColumnarIntervalStep
from millwheel.runtime._fs import Location
from millwheel.runtime.plans.arrow import BatchPlan, IntervalTask, out_arrow_schema

n, files, keys, disorder = (int(a) for a in sys.argv[1:5])
skew = float(sys.argv[5])
t = Topology("bench")
t.injector("q", SampleSource([]))
t.computation(ColumnarWindowCounter, name="C", inputs={"q": lambda r: r.value}, outputs=["window_counts"],
              options=ComputationOptions(mapping="arrow"), params={"window_ms": 1000, "trailing_empty": 10})
step = ColumnarIntervalStep(t.validate().computations["C"], groups=[0])
rng = random.Random(7)
t0 = 1_700_000_000_000
per = n // files
ids, names, ks, ts, wm = [], [], [], [], []
for f in range(files):
    for i in range(per):
        ids.append(f"r{f}-{i}")
        names.append(f"k{int(keys * rng.random() ** skew)}")
        ks.append(encode_key(names[-1]))
        ts.append(t0 + f * 1000 + rng.randrange(-disorder, 1000))
        wm.append(t0 + f * 1000 - disorder if f else None)
m = len(ids)
rows = pa.RecordBatch.from_pydict({
    "group": pa.array([0] * m, pa.int32()), "kind": pa.array([0] * m, pa.int32()),
    "key": pa.array(ks, pa.binary()), "id": pa.array(ids, pa.string()),
    "ts": pa.array(ts, pa.int64()), "value": pa.array([encode_value(None)] * m, pa.binary()),
    "wm": pa.array(wm, pa.int64()), "stream": pa.array(["q"] * m, pa.string()),
    "src": pa.array([f"f{i // per}" for i in range(m)], pa.string()),
    "row": pa.array(range(m), pa.int64()), "now": pa.nulls(m, pa.int64()),
})
out = {}
for name, lw in (("before", t0 - disorder - 1), ("inf", MAX_TIMESTAMP)):
    root = ColumnarFiles(Location.of(tempfile.mkdtemp()))
    plan = BatchPlan(0, "b", lw, 0, Manifest().low_watermark, 1, {}, (), root.loc.uri, {})
    start = time.perf_counter()
    got = pa.Table.from_batches(list(IntervalTask(step, plan)(iter([rows]))), schema=out_arrow_schema(step))
    out[name + "_s"] = time.perf_counter() - start
    prods = sorted(zip(*(got.column(c).to_pylist() for c in ("stream", "id", "ts", "value"))))
    prods = [p for p in prods if p[0] == "window_counts"]
    out[name + "_productions"] = len(prods)
    out[name + "_digest"] = hashlib.sha256(repr(prods).encode()).hexdigest()[:16]
    if name == "inf":  # every window's count against a plain count of the records (none is late)
        got_counts = {}
        for p in prods:
            v = decode_value(p[3])
            if v["count"]:
                got_counts[(v["key"], v["window_start"])] = v["count"]
        want = Counter((k, s // 1000 * 1000) for k, s in zip(names, ts, strict=True))
        if got_counts != dict(want):
            raise SystemExit(f"window counts differ from the batch answer: {len(got_counts)} windows against {len(want)}")
        out["windows_checked"] = len(want)
print(json.dumps(out))
"""


def one_pass(checkout: Path, n: int, files: int, keys: int, disorder: int, skew: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", PASS, str(n), str(files), str(keys), str(disorder), str(skew)],
        env=env,
        cwd=checkout,  # ``python -c`` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode:
        msg = f"{checkout}: {done.stderr[-2000:]}"
        raise SystemExit(msg)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", action="append", default=[], help="another checkout")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--files", default="1,24,241", help="arrival watermarks (files) per batch")
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--disorder-ms", type=int, default=3_000)
    p.add_argument(
        "--skew",
        type=float,
        default=1.0,
        help="key k drawn as keys * U**skew: 1 uniform (every key in every file), above 1 a few "
        "popular keys and many rare ones, as in query logs (a key's records in some files only)",
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    checkouts = {"now": ROOT, **{f"compare{i}": Path(c) for i, c in enumerate(args.compare)}}
    rows = []
    for files in [int(f) for f in args.files.split(",")]:
        runs: dict[str, list[dict]] = {k: [] for k in checkouts}
        for _ in range(args.reps):
            for name, checkout in checkouts.items():
                runs[name].append(
                    one_pass(checkout, args.records, files, args.keys, args.disorder_ms, args.skew)
                )
        for name, passes in runs.items():
            row = {
                "checkout": name,
                "commit": git_head(checkouts[name], dirty=True),
                "files": files,
                "before_s": statistics.median(r["before_s"] for r in passes),
                "inf_s": statistics.median(r["inf_s"] for r in passes),
                "inf_productions": passes[0]["inf_productions"],
                "inf_digest": passes[0]["inf_digest"],
                "windows_checked": passes[0].get("windows_checked"),
            }
            rows.append(row)
            print(
                f"{name:9} {files:4} files: under the watermark before {row['before_s']:.2f} s, "
                f"under +inf {row['inf_s']:.2f} s ({row['inf_productions']} productions, {row['inf_digest']})"
            )
        digests = {r["inf_digest"] for r in rows if r["files"] == files}
        if len(digests) != 1:
            msg = f"{files} files: the checkouts' productions differ: {digests}"
            raise SystemExit(msg)
    result = {
        "what": "one key interval's Arrow task over a batch of many arrival watermarks (ColumnarWindowCounter)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "keys": args.keys,
        "disorder_ms": args.disorder_ms,
        "skew": args.skew,
        "reps": args.reps,
        "rows": rows,
    }
    out = Path(
        args.out or ROOT / "bench" / "results" / f"arrival_runs_{time.strftime('%Y%m%d')}.json"
    )
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
