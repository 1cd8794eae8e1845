"""How soon a live run's one-second windows come out over growing, rotating log files (MillWheel Fig. 10).

    .venv/bin/python bench/live_logs_bench.py              # 30 s of writing, files rotated every 4 s
    .venv/bin/python bench/live_logs_bench.py --live-s 60

The scenario of ``examples/live_logs.py``, which ``tests/runtime/test_live_logs.py`` runs to check what must hold (every
record counted once, windows out while the files are still written); this measures the
figure that depends on the machine: a writer appends records stamped with wall time (100/s,
three keys) and opens a new file every ``--rotate-s`` seconds; the injector low watermark
follows read progress minus ``lateness_ms`` and rotation finishes the old file. A window's
*delay* is from its end (wall time) to when its output became visible (published after
Spark's commit), over the windows that closed at least 10 s before the input was declared
complete.

Prints the delay's p50, p90 and max and how many windows came out before ``_DONE``; writes
``bench/results/live_logs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.live_logs import drive, published_windows, topology  # noqa: E402
from millwheel.runtime import RuntimeSettings, SparkRuntime, spark_session  # noqa: E402


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-s", type=float, default=30.0)
    parser.add_argument("--rotate-s", type=float, default=4.0)
    parser.add_argument("--lateness-ms", type=int, default=300)
    args = parser.parse_args()
    spark = spark_session("local[2]")
    with tempfile.TemporaryDirectory(prefix="live-logs-bench-") as d:
        tmp = Path(d)
        logs = tmp / "logs"
        logs.mkdir()
        settings = RuntimeSettings(intervals=2, poll_ms=50, heartbeat_ms=100)
        rt = SparkRuntime(topology(logs, args.lateness_ms), str(tmp / "run"), settings, spark=spark)
        written, done_at = drive(rt, logs, args.live_s, args.rotate_s)
        visible = published_windows(rt)
    spark.stop()
    closed_live = [k for k in visible if (k[1] + 1_000) / 1000 < done_at - 10]
    delays = sorted(visible[k] - (k[1] + 1_000) / 1000 for k in closed_live)
    emitted_live = sum(1 for k in closed_live if visible[k] < done_at)
    if not delays:
        print("no window closed while the files were written: run longer (--live-s)")
        return 1
    figures = {"p50": statistics.median(delays), "p90": percentile(delays, 0.9), "max": delays[-1]}
    print(
        f"{len(written):,} records over {args.live_s:.0f} s, files rotated every {args.rotate_s:.0f} s, lateness {args.lateness_ms} ms"
    )
    print(f"windows closed while live: {len(closed_live)}, out before _DONE: {emitted_live}")
    print(
        "window delay (end of window -> output visible): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in figures.items())
    )
    out = {
        "bench": "live_logs",
        "live_s": args.live_s,
        "rotate_s": args.rotate_s,
        "lateness_ms": args.lateness_ms,
        "records": len(written),
        "windows_closed_live": len(closed_live),
        "windows_out_before_done": emitted_live,
        "delay_s": {k: round(v, 3) for k, v in figures.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (ROOT / "bench" / "results" / "live_logs.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
