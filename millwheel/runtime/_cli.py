"""``millwheel run --backend spark``: run a topology on Spark with a live status display.

Called by :mod:`millwheel.cli`; kept here so that ``millwheel/cli.py`` imports no pyspark.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from typing import Any

from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP
from millwheel._topology import Topology


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spark backend")
    g.add_argument("--master", default=None, help="Spark master (default local[*]; e.g. spark://host:7077)")
    g.add_argument("--checkpoint", default=None, help="run directory: stream logs, checkpoints; a restart resumes from it (default .millwheel/runs/<topology>)")
    g.add_argument("--fresh", action="store_true", help="delete the run directory first")
    g.add_argument("--trigger-ms", type=int, default=0, help="micro-batch trigger interval in ms (0: back to back)")
    g.add_argument("--intervals", type=int, default=16, help="key intervals (Spark groups) per computation")
    g.add_argument(
        "--until-drained", "--drain", dest="drain", action="store_true",
        help="treat log-file directories as complete (finite input); the run stops once every input is drained and timers are flushed, as it always does for finite sources",
    )  # fmt: skip
    g.add_argument("--status-every", type=float, default=2.0, help="seconds between status lines (0: none)")
    g.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    g.add_argument("--authority", default=None, help="URL of a running watermark authority (default: an embedded one)")
    g.add_argument(
        "--only", default=None,
        help="comma-separated computations/injectors to run here; the others run in another driver on the same "
        "--checkpoint and --authority (add a computation to a running topology)",
    )  # fmt: skip


def _ts(v: int) -> str:
    if v >= MAX_TIMESTAMP:
        return "+inf (done)"
    if v <= MIN_TIMESTAMP:
        return "-inf"
    if v > 10**11:
        return dt.datetime.fromtimestamp(v / 1000, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    return str(v)


def status_lines(rt: Any) -> list[str]:
    now = int(time.time() * 1000)
    lines = [f"{'name':<22} {'in':>9} {'out':>9} {'dead':>6} {'low watermark':>16} {'lag':>10}"]
    for name, s in rt.status().items():
        lw = s["low_watermark"]
        lag = "-" if lw in (MIN_TIMESTAMP, MAX_TIMESTAMP) else f"{(now - lw) / 1000:.1f}s"
        rin = s.get("records_in", "")
        rout = s.get("productions", s.get("records_out", 0))
        lines.append(f"{name:<22} {rin!s:>9} {rout:>9} {s.get('dead_letters', 0):>6} {_ts(lw):>16} {lag:>10}")
    lines += [f"warning: {s['warning']}" for s in rt.status().values() if s.get("warning")]
    return lines


def run(topology: Topology, args: argparse.Namespace, on_finish: Any = None) -> int:
    """Run on Spark; ``on_finish(topology, streams, metrics)`` (from the topology module) is printed at the end."""
    from millwheel._runner import print_finish
    from millwheel.runtime._runtime import RuntimeSettings, SparkRuntime
    from watermark_authority.client import open_authority

    root = args.checkpoint or os.path.join(".millwheel", "runs", topology.name)
    if args.fresh and os.path.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root, exist_ok=True)
    master = args.master or "local[*]"
    settings = RuntimeSettings(
        intervals=args.intervals, master=master, trigger_ms=args.trigger_ms, drain=args.drain,
        status_every_s=args.status_every or None,
        only=tuple(n for n in (args.only or "").split(",") if n),
    )  # fmt: skip
    print(f"millwheel: running {topology.name!r} on Spark {master}; run directory {root} (a restart resumes from it)", file=sys.stderr)
    started = time.perf_counter()
    with open_authority(args.authority, data_dir=os.path.join(os.path.abspath(root), "authority")) as wm:
        rt = SparkRuntime(topology, root, settings, watermarks=wm)
        url = getattr(wm, "url", None)
        if url:
            print(f"millwheel: watermark authority and its lag dashboard at {url}/ (pass --authority {url} to a second driver)", file=sys.stderr)

        def show(r: SparkRuntime) -> None:
            print(f"--- {time.perf_counter() - started:6.1f}s", file=sys.stderr)
            for line in status_lines(r):
                print("  " + line, file=sys.stderr)

        try:
            rt.run(timeout_s=args.timeout, on_status=show)
        except KeyboardInterrupt:
            print("millwheel: stopping (Ctrl-C); run again with the same --checkpoint to resume", file=sys.stderr)
            rt.stop()
            return 130
        print(f"topology {topology.name}: ran on Spark in {time.perf_counter() - started:.1f}s")
        for line in status_lines(rt):
            print("  " + line)
        metrics = {name: dict(q.metrics) for name, q in rt.computations.items()}
        print_finish(topology, rt.values, rt.dead_letters(), metrics, on_finish)
    return 0
