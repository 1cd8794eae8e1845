"""The main job batch by batch (a command, not a test): ``python bench/main_job_trace.py RUN_DIR [millwheel run options]``.

Runs ``millwheel run topologies/zeitgeist --checkpoint RUN_DIR`` in this process and, as
the run stops, prints a timeline in seconds from this script's start: every micro-batch of
every query (start, duration, input rows, the watermark it ran under, the phases over
50 ms, from the queries' ``recentProgress``), every heartbeat file the driver wrote
(computation, watermark, ticks), and when each stream log got its first file. This is how
``docs/performance.md`` ("The main job") follows where the seconds before the first anomaly
go; ``bench/main_job_bench.py`` gives the wall times side by side. Take the Spark lock
around it (``flock /tmp/millwheel-spark.lock python bench/main_job_trace.py ...``).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from typing import Any

T0 = time.time()


def _batches(rt: Any) -> list[tuple[float, str]]:
    queries = [(n, c.query) for n, c in rt.computations.items()] + [
        (n, i.query) for n, i in rt.injectors.items()
    ]
    rows = []
    for name, q in queries:
        for p in [] if q is None else q.recentProgress:
            if not p["numInputRows"] and not p["durationMs"].get("addBatch"):
                continue  # a trigger that found nothing to run
            at = (
                datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
                .replace(tzinfo=timezone.utc)
                .timestamp()
                - T0
            )
            took = p["durationMs"].get("triggerExecution", 0) / 1000
            phases = {
                k: v for k, v in p["durationMs"].items() if v > 50 and k != "triggerExecution"
            }
            wm = p.get("eventTime", {}).get("watermark")
            rows.append(
                (
                    at,
                    f"{at:6.2f} +{took:5.2f} -> {at + took:6.2f}  {name:>16} b{p['batchId']:<3} in={p['numInputRows']:<7} wm={wm} {phases}",
                )
            )
    return rows


def _first_files(root: str) -> list[str]:
    out = []
    streams = os.path.join(root, "streams")
    for stream in sorted(os.listdir(streams)):
        for producer in sorted(os.listdir(os.path.join(streams, stream))):
            d = os.path.join(streams, stream, producer)
            if producer.startswith(("_", ".")) or not os.path.isdir(d):
                continue
            times = sorted(
                os.stat(os.path.join(d, e)).st_mtime - T0
                for e in os.listdir(d)
                if not e.startswith(("_", "."))
            )
            if times:
                out.append(
                    f"stream {stream}/{producer}: first file {times[0]:.2f} ({len(times)} files)"
                )
    return out


def main(argv: list[str]) -> int:
    from millwheel.runtime import _query, _runtime

    run_dir, options = argv[0], argv[1:]
    heartbeats: list[tuple[float, str]] = []
    write_heartbeat, stop = _query.ComputationQuery._write_heartbeat, _runtime.SparkRuntime.stop

    def traced_heartbeat(
        self: Any, wm: int | None, ticks: list[tuple[int, int]], *rest: Any, **kw: Any
    ) -> None:
        # rest: the intervals it is addressed to and the newest batch it counts (``_query.py``)
        at = time.time() - T0
        to = len(rest[0]) if rest else len(kw.get("to", ()))
        heartbeats.append(
            (
                at,
                f"{at:6.2f} heartbeat {self.name:>16} #{self._hb_seq} wm={wm} ticks={len(ticks)} to={to}",
            )
        )
        write_heartbeat(self, wm, ticks, *rest, **kw)

    def traced_stop(self: Any) -> None:
        lines = [line for _, line in sorted(_batches(self) + heartbeats)]
        print(
            "\n".join(
                [
                    "",
                    f"timeline of {run_dir} (s from start):",
                    *lines,
                    *_first_files(run_dir),
                    f"stopping at {time.time() - T0:.2f}",
                ]
            ),
            file=sys.stderr,
        )
        stop(self)

    _query.ComputationQuery._write_heartbeat = traced_heartbeat  # type: ignore[method-assign]
    _runtime.SparkRuntime.stop = traced_stop  # type: ignore[method-assign]
    from millwheel.cli import main as millwheel

    return millwheel(["run", "topologies/zeitgeist", "--checkpoint", run_dir, *options])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1:]))
