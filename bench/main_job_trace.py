"""The main job batch by batch (a command, not a test): ``python bench/main_job_trace.py RUN_DIR [millwheel run options]``.

Runs ``millwheel run topologies/zeitgeist --checkpoint RUN_DIR`` in this process and, as
the run stops, prints a timeline in seconds from this script's start: every micro-batch of
every query (start, duration, input rows, the watermark it ran under, the phases over
50 ms, from the queries' ``recentProgress``), every Spark job (from the UI's REST API:
its span, its query and task seconds), the runtime's start, the Python workers' warm-up
and each query's start, every heartbeat file the driver wrote (computation, watermark,
ticks), and when each stream log got its first file. This is how
``docs/performance.md`` ("The main job") follows where the seconds before the first anomaly
go; ``bench/main_job_bench.py`` gives the wall times side by side. Take the Spark lock
around it (``flock /tmp/millwheel-spark.lock python bench/main_job_trace.py ...``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

T0 = time.time()


def _since_start(stamp: str, fmt: str) -> float:
    """Seconds from this script's start to a UTC time stamp Spark wrote in ``fmt``."""
    return datetime.strptime(stamp, fmt).replace(tzinfo=timezone.utc).timestamp() - T0


def _batches(rt: Any) -> list[tuple[float, str]]:
    queries = [(n, c.query) for n, c in rt.computations.items()] + [
        (n, i.query) for n, i in rt.injectors.items()
    ]
    rows = []
    for name, q in queries:
        for p in [] if q is None else q.recentProgress:
            if not p["numInputRows"] and not p["durationMs"].get("addBatch"):
                continue  # a trigger that found nothing to run
            at = _since_start(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
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


def _jobs(rt: Any) -> list[tuple[float, str]]:
    """Every Spark job of the run from the UI's REST API (none without the UI): its start
    and end, which query's batch ran it, its stages' task time."""
    import json
    import urllib.request

    sc = rt.spark.sparkContext
    url = sc.uiWebUrl
    if not url:
        return []
    base = f"{url}/api/v1/applications/{sc.applicationId}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{base}/{path}", timeout=10) as r:  # noqa: S310 - the local UI
            return json.load(r)

    stages = {s["stageId"]: s for s in get("stages")}
    rows = []
    for job in get("jobs"):
        if "submissionTime" not in job or "completionTime" not in job:
            continue
        start, end = (
            _since_start(job[k], "%Y-%m-%dT%H:%M:%S.%f%Z")
            for k in ("submissionTime", "completionTime")
        )
        task_s = sum(
            stages[i].get("executorRunTime", 0) for i in job.get("stageIds", ()) if i in stages
        )
        what = (job.get("description") or job.get("name") or "")[:60].replace("\n", " ")
        rows.append(
            (
                start,
                f"{start:6.2f} +{end - start:5.2f} -> {end:6.2f}   job {job['jobId']:>3} "
                f"{len(job.get('stageIds', ()))} stage(s) {job.get('numTasks', 0)} tasks "
                f"{task_s / 1000:.2f} task-s  {what}",
            )
        )
    return rows


def main(argv: list[str]) -> int:
    from millwheel.runtime import _query, _runtime

    run_dir, options = argv[0], argv[1:]
    marks: list[tuple[float, str]] = []  # heartbeats written, spans timed
    write_heartbeat, stop = _query.ComputationQuery._write_heartbeat, _runtime.SparkRuntime.stop

    def traced_heartbeat(
        self: Any, wm: int | None, ticks: list[tuple[int, int]], *rest: Any, **kw: Any
    ) -> None:
        # rest: the intervals it is addressed to and the newest batch it counts (``_query.py``)
        at = time.time() - T0
        to = len(rest[0]) if rest else len(kw.get("to", ()))
        marks.append(
            (
                at,
                f"{at:6.2f} heartbeat {self.name:>16} #{self._hb_seq} wm={wm} ticks={len(ticks)} to={to}",
            )
        )
        write_heartbeat(self, wm, ticks, *rest, **kw)

    def traced_stop(self: Any) -> None:
        lines = [line for _, line in sorted(_batches(self) + marks + _jobs(self))]
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

    def spans(owner: Any, attr: str, label: Callable[[tuple[Any, ...]], str]) -> None:
        """``owner.attr`` timed: a line when it starts, with how long it took."""
        inner = getattr(owner, attr)

        def timed(*args: Any, **kw: Any) -> Any:
            start = time.time() - T0
            try:
                return inner(*args, **kw)
            finally:
                end = time.time() - T0
                marks.append(
                    (start, f"{start:6.2f} +{end - start:5.2f} -> {end:6.2f}   {label(args)}")
                )

        setattr(owner, attr, timed)

    spans(_runtime.SparkRuntime, "start", lambda a: "runtime start")
    spans(_runtime.SparkRuntime, "use_session", lambda a: "Spark session handed over")
    spans(_runtime, "warm_python_workers", lambda a: "warming the Python workers")
    spans(_query.ComputationQuery, "start", lambda a: f"query start {a[0].name}")
    _query.ComputationQuery._write_heartbeat = traced_heartbeat  # type: ignore[method-assign]
    _runtime.SparkRuntime.stop = traced_stop  # type: ignore[method-assign]
    from millwheel.cli import main as millwheel

    return millwheel(["run", "topologies/zeitgeist", "--checkpoint", run_dir, *options])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1:]))
