"""Benchmark the log reading plan's scan beside the reader it plans for (``millwheel/_logplan.py``, ``millwheel/_logfile.py``).

    .venv/bin/python bench/logfile_plan_bench.py                  # 200k events in 8 files, 3 repeats
    .venv/bin/python bench/logfile_plan_bench.py --events 1000000

Since every file's promise must be a lower bound (``promise`` in ``millwheel/_logplan.py``), the plan scans the bytes it
hands to a batch for their timestamps (the smallest, the newest, the disorder) on the
driver, before the batch is read. Side by side, in one run, on the same files:

* ``read`` — the bytes read, nothing else (the floor);
* ``plan`` — :func:`plan_offset` of the whole directory (reads and scans it);
* ``parse`` — :func:`read_range` of every planned range: what the readers (the Spark
  executors, the harness) do with the same bytes — parse every line, make records.

Prints MB/s and events/s per step and the plan's cost as a share of the parse; writes
``bench/results/logfile_plan.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from millwheel._logfile import LogFileSource, initial_offset, plan_offset, plan_ranges, read_range  # noqa: E402


def write(directory: Path, events: int, files: int, seed: int) -> int:
    rng = random.Random(seed)
    per = -(-events // files)
    size = 0
    for f in range(files):
        with open(directory / f"part-{f:04d}.jsonl", "w") as out:
            for i in range(f * per, min(events, (f + 1) * per)):
                ts = 1_767_261_600_000 + i * 5 - rng.randint(0, 5_000)
                line = (
                    json.dumps(
                        {
                            "id": f"e{i}",
                            "ts": ts,
                            "key": f"k{i % 97}",
                            "path": f"/p/{rng.randrange(100)}",
                        }
                    )
                    + "\n"
                )
                out.write(line)
                size += len(line)
    return size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as d:
        path = Path(d)
        size = write(path, args.events, args.files, 7)
        src = LogFileSource(path, finite=True)
        opts = src.read_options
        best = {"read": float("inf"), "plan": float("inf"), "parse": float("inf")}
        for _ in range(args.repeats):
            t = time.perf_counter()
            for name in sorted(os.listdir(path)):
                with open(path / name, "rb") as fh:
                    fh.read()
            best["read"] = min(best["read"], time.perf_counter() - t)
            t = time.perf_counter()
            end = plan_offset(initial_offset(), opts, 0)
            best["plan"] = min(best["plan"], time.perf_counter() - t)
            t = time.perf_counter()
            n = 0
            for r in plan_ranges(initial_offset(), end, 0):
                n += len(read_range(opts, r, "logs", "events").records)
            best["parse"] = min(best["parse"], time.perf_counter() - t)
        assert n == args.events, n
    mb = size / 1e6
    rows = {
        k: {
            "seconds": round(v, 4),
            "mb_per_s": round(mb / v, 1),
            "events_per_s": round(args.events / v),
        }
        for k, v in best.items()
    }
    share = best["plan"] / best["parse"]
    print(f"{args.events:,} events, {mb:.1f} MB in {args.files} files; best of {args.repeats}")
    for k, v in rows.items():
        print(
            f"  {k:<6} {v['seconds']:>8.3f} s {v['mb_per_s']:>8.1f} MB/s {v['events_per_s']:>12,} events/s"
        )
    print(f"  the plan's scan costs {share:.0%} of what parsing the same bytes costs")
    out = {
        "bench": "logfile_plan",
        "events": args.events,
        "files": args.files,
        "mb": round(mb, 1),
        "repeats": args.repeats,
        "steps": rows,
        "plan_over_parse": round(share, 3),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (ROOT / "bench" / "results" / "logfile_plan.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
