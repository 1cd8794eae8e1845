"""``millwheel run --backend spark``: run a topology on Spark, with a live status, the Spark UI and metrics.

Called by :mod:`millwheel.cli`; kept here so that ``millwheel/cli.py`` imports no pyspark.
What it prints, in order (to stderr, except the final report):

1. where the run goes (master, run directory), the watermark authority's dashboard, the
   metrics endpoint, Spark starting and its UI, each query as it starts — so the ~10–20 s
   before the first micro-batch are not silent;
2. the live status (``_status.py``): a table redrawn in place on a terminal, one compact
   line per ``--status-every`` seconds in a log, nothing with ``--quiet``;
3. on stdout, the final table, the sinks and the topology module's ``on_finish``.

A run directory whose run finished (every input drained, every low watermark +inf) has a
``finished.json``: running it again prints its results at once, without starting Spark,
unless a log file appeared or grew since (:func:`input_changed`: then it says so and exits 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

from millwheel._record import utc_text
from millwheel._topology import Topology
from millwheel.runtime._status import (
    Row,
    Sampler,
    Snapshot,
    counts_of,
    disorder_of,
    display_for,
    table_lines,
)

FINISHED = "finished.json"
#: ``MILLWHEEL_SPARK_UI=0`` turns the Spark UI off by default (the test suite sets it)
UI_ENV = "MILLWHEEL_SPARK_UI"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spark backend")
    g.add_argument(
        "--master",
        default=None,
        help="Spark master (default local[*], or spark-submit's; e.g. spark://host:7077)",
    )
    g.add_argument(
        "--checkpoint",
        default=None,
        help="run directory: stream logs, checkpoints; a restart resumes from it (default .millwheel/runs/<topology>)",
    )
    g.add_argument("--fresh", action="store_true", help="delete the run directory first")
    g.add_argument(
        "--trigger-ms",
        type=int,
        default=0,
        help="micro-batch trigger interval in ms (default 0: back to back)",
    )
    g.add_argument(
        "--intervals",
        type=int,
        default=None,
        help="key intervals (Spark groups) per computation (default: a run directory's own, else on its first start two per core of local[N], 16 on a cluster); fixed by a run's first start, then changed with millwheel rescale",
    )
    g.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="Spark shuffle partitions (default: the cores of local[N], else 8); fixed by a run's first start",
    )
    g.add_argument(
        "--until-drained",
        "--drain",
        dest="drain",
        action="store_true",
        help="treat log-file directories as complete (finite input); the run stops once every input is drained and timers are flushed, as it always does for finite sources",
    )
    g.add_argument(
        "--status-every",
        type=float,
        default=2.0,
        help="seconds between status updates (default 2; 0: none)",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no live status and no progress lines; only the final report",
    )
    g.add_argument(
        "--ui",
        dest="ui",
        action="store_true",
        default=None,
        help="serve the Spark UI (the default)",
    )
    g.add_argument("--no-ui", dest="ui", action="store_false", help="no Spark UI")
    g.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="port of the Prometheus endpoint /metrics (default: any free port)",
    )
    g.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint listens on (default loopback)",
    )
    g.add_argument("--no-metrics", dest="metrics", action="store_false", help="no metrics endpoint")
    g.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    g.add_argument(
        "--authority",
        default=None,
        help="URL of a running watermark authority (default: an embedded one)",
    )
    g.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, repeatable (e.g. --conf spark.executor.memory=2g); overrides the topology's spark_conf",
    )
    g.add_argument(
        "--packages",
        default=None,
        metavar="COORDS",
        help="comma-separated Maven coordinates Spark fetches for the driver and executors (spark.jars.packages), e.g. Kafka's org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0",
    )
    g.add_argument(
        "--jars",
        default=None,
        metavar="FILES",
        help="comma-separated local jars for the driver and executors (spark.jars), e.g. a connector without network access",
    )
    g.add_argument(
        "--autoscale",
        action="store_true",
        help="split a computation's key intervals when some are far hotter than the median for several batches, merge them when all are cold (online rescales; docs/runtime.md)",
    )
    g.add_argument(
        "--only",
        default=None,
        help="comma-separated computations/injectors to run here; the others run in another driver on the same "
        "--checkpoint and --authority (add a computation to a running topology)",
    )


def spark_conf(topology: Topology, args: argparse.Namespace) -> dict[str, str]:
    """The Spark settings of a run: the topology's ``spark_conf``, then ``--packages``,
    ``--jars`` and every ``--conf KEY=VALUE`` (the command line wins).

    >>> ns = argparse.Namespace(conf=["spark.executor.memory=2g", "a.b=x=y"], packages="g:a:1", jars=None)
    >>> spark_conf(Topology("t", spark_conf={"spark.executor.memory": "1g"}), ns)
    {'spark.executor.memory': '2g', 'spark.jars.packages': 'g:a:1', 'a.b': 'x=y'}
    """
    from millwheel._errors import MillwheelError

    conf = dict(topology.spark_conf)
    if getattr(args, "packages", None):
        conf["spark.jars.packages"] = args.packages
    if getattr(args, "jars", None):
        conf["spark.jars"] = args.jars
    for item in getattr(args, "conf", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            msg = f"--conf takes KEY=VALUE (e.g. --conf spark.executor.memory=2g), got {item!r}"
            raise MillwheelError(msg)
        conf[key.strip()] = value
    return conf


def _components(topology: Topology, only: tuple[str, ...]) -> list[str]:
    names = [*topology.injectors, *topology.computations]
    return sorted(n for n in names if not only or n in only)


def _sink_hints(topology: Topology, root: str) -> dict[str, str]:
    from millwheel.runtime._sinks import parse_target

    out = {}
    for s in topology.sinks.values():
        if s.spark is not None:
            how = (
                f"format {s.spark.format!r}"
                if s.spark.format
                else f"foreach_batch {getattr(s.spark.foreach_batch, '__name__', 'function')}"
            )
            out[s.name] = (
                f"written through Spark ({how}); all of them: millwheel read {root} {s.stream}"
            )
        elif s.target is not None:
            t = parse_target(s.target, f"sink {s.name!r}")
            out[s.name] = (
                f"written to {t.path} ({t.format}); all of them: millwheel read {root} {s.stream}"
            )
        else:
            out[s.name] = f"all of them: millwheel read {root} {s.stream}"
    return out


def _stream_values(root: str) -> tuple[Callable[[str], list[Any]], Callable[[], list[Any]]]:
    from millwheel._deadletter import DEAD_LETTER_STREAM
    from millwheel.runtime._fs import Location
    from millwheel.runtime._streams import FileStreamLog

    streams = FileStreamLog(Location.of(root))
    if not Location.of(root).child("streams").exists():
        return (lambda _s: []), list
    return (lambda s: [r.value for r in streams.read(s)] if s in streams.root.list() else []), (
        lambda: (
            streams.read(DEAD_LETTER_STREAM) if DEAD_LETTER_STREAM in streams.root.list() else []
        )
    )


def _finished(root: str, topology: Topology, only: tuple[str, ...]) -> dict[str, Any] | None:
    path = os.path.join(root, FINISHED)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if (
        not isinstance(saved, dict)
        or saved.get("topology") != topology.name
        or saved.get("components") != _components(topology, only)
    ):
        return None
    if not all(k in saved for k in ("rows", "elapsed_s", "finished_at_ms", "metrics")):
        return None  # written by another version: run normally (a finished run ends at once)
    from millwheel.runtime._fs import Location
    from millwheel.runtime._layout import pending_moves, read_pin

    if pending_moves(read_pin(Location.of(root))):
        return (
            None  # rescaled since it finished: the run starts, and its first batch moves the state
        )
    return saved


def _log_listing(topology: Topology) -> dict[str, dict[str, int]]:
    """Each log-file injector's files and their sizes: what a finished run had read."""
    from millwheel._logfile import LogFileSource
    from millwheel._logplan import log_names

    out: dict[str, dict[str, int]] = {}
    for spec in topology.injectors.values():
        if isinstance(spec.source, LogFileSource):
            path = spec.source.path
            out[spec.name] = {n: os.stat(os.path.join(path, n)).st_size for n in log_names(path)}
    return out


def input_changed(saved: dict[str, Any], topology: Topology) -> list[str]:
    """The log files that appeared or grew since the run finished, as ``injector: name (new|grew)``.

    A finished run's injectors promised that nothing more would come (their low watermarks
    are +inf, §4.5): records read from such files now would all be late. So the finished
    run's answer is not given for changed input as if it were current, and the run does
    not read them either; the caller says what to do instead. A ``finished.json`` written
    before the listing was kept has none, and nothing is compared."""
    before = saved.get("logs")
    if not isinstance(before, dict):
        return []
    out = []
    for injector, files in _log_listing(topology).items():
        old = before.get(injector)
        if not isinstance(old, dict):
            continue
        for name, size in files.items():
            if name not in old:
                out.append(f"{injector}: {name} (new)")
            elif size > old[name]:
                out.append(f"{injector}: {name} (grew)")
    return out


def _report(
    topology: Topology,
    root: str,
    snapshot: Snapshot | None,
    metrics: dict[str, dict[str, int]],
    on_finish: Any,
    headline: str,
) -> None:
    from millwheel._runner import print_finish

    print(headline)
    if snapshot is not None:
        for line in table_lines(
            snapshot, late=False
        ):  # print_finish says them once, as the harness's run does
            print("  " + line)
    values, dead = _stream_values(root)
    disorder = disorder_of(snapshot.rows) if snapshot is not None else None
    counts = counts_of(snapshot.rows) if snapshot is not None else None
    print_finish(
        topology,
        values,
        dead(),
        metrics,
        on_finish,
        where=_sink_hints(topology, root),
        disorder=disorder,
        counts=counts,
    )


def run(topology: Topology, args: argparse.Namespace, on_finish: Any = None) -> int:
    """Run on Spark; ``on_finish(topology, streams, metrics)`` (from the topology module) is printed at the end."""
    from millwheel.runtime._session import under_spark_submit

    root = args.checkpoint or os.path.join(".millwheel", "runs", topology.name)
    if args.fresh and os.path.isdir(root):
        shutil.rmtree(root)
    only = tuple(n for n in (args.only or "").split(",") if n)
    saved = None if args.fresh else _finished(root, topology, only)
    if saved is not None:
        known = {f.name for f in fields(Row)}
        rows = tuple(Row(**{k: v for k, v in r.items() if k in known}) for r in saved["rows"])
        snapshot = Snapshot(saved["elapsed_s"], saved["finished_at_ms"], rows)
        when = utc_text(saved["finished_at_ms"]) + " UTC"
        changed = input_changed(saved, topology)
        if changed:
            shown = "; ".join(changed[:5]) + (
                f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
            )
            print(
                f"millwheel: the run in {root} finished on {when}, and its input changed since: {shown}. A finished run "
                "promised that no more input would come (its low watermarks are +inf), so these records would all be late. "
                "Run with --fresh to compute everything again with them (or use another --checkpoint); to add files to a "
                "run as they come, keep it running on an open directory (no finite=True, no --until-drained).",
                file=sys.stderr,
            )
            return 2
        print(
            f"millwheel: the run in {root} finished on {when}; nothing is left to do (--fresh runs it again)",
            file=sys.stderr,
        )
        _report(
            topology,
            root,
            snapshot,
            saved["metrics"],
            on_finish,
            f"topology {topology.name}: finished on Spark in {saved['elapsed_s']:.1f}s (on {when})",
        )
        return 0
    os.makedirs(root, exist_ok=True)
    master = args.master or (None if under_spark_submit() else "local[*]")
    ui = args.ui if args.ui is not None else os.environ.get(UI_ENV, "1") != "0"
    quiet = args.quiet
    say: Callable[[str], None] = (
        (lambda _m: None)
        if quiet
        else (lambda m: print(f"millwheel: {m}", file=sys.stderr, flush=True))
    )
    started = time.perf_counter()
    say(
        f"running {topology.name!r} on Spark {master or '(spark-submit)'}; run directory {root} (a restart resumes from it)"
    )
    try:
        return _run(topology, args, on_finish, root, master, ui, only, say, started)
    except KeyboardInterrupt:
        print(
            "millwheel: stopped (Ctrl-C); run again with the same --checkpoint to resume",
            file=sys.stderr,
        )
        return 130


def _run(
    topology: Topology,
    args: argparse.Namespace,
    on_finish: Any,
    root: str,
    master: str | None,
    ui: bool,
    only: tuple[str, ...],
    say: Callable[[str], None],
    started: float,
) -> int:
    from millwheel.runtime._autoscale import AutoscalePolicy
    from millwheel.runtime._metrics import serve
    from millwheel.runtime._runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._session import spark_session, ui_url, under_spark_submit
    from servicekit.client import fragment_url
    from watermark_authority.client import open_authority

    sampler: Sampler | None = None
    metrics_server = (
        serve(
            lambda: sampler.last if sampler else None,
            topology.name,
            args.metrics_host,
            args.metrics_port,
        )
        if args.metrics
        else None
    )
    try:
        with open_authority(
            args.authority, data_dir=os.path.join(os.path.abspath(root), "authority")
        ) as wm:
            url = getattr(wm, "url", None)
            if url:
                link = fragment_url(
                    f"{url}/", metrics=metrics_server.url if metrics_server else None
                )
                say(
                    f"watermark authority and its lag dashboard at {link} (pass --authority {url} to a second driver)"
                )
            if metrics_server:
                say(f"metrics (Prometheus) at {metrics_server.url}")
            display = display_for(
                args.quiet or not args.status_every,
                title=f"{topology.name} on {master or 'spark-submit'}",
            )
            t_start = [time.perf_counter()]

            def progress(what: str) -> None:
                say(f"  starting {what} ({time.perf_counter() - t_start[0]:.1f}s)")

            def runtime(on: str, spark: Any = None) -> SparkRuntime:
                settings = RuntimeSettings(
                    intervals=args.intervals,
                    master=on,
                    trigger_ms=args.trigger_ms,
                    drain=args.drain,
                    status_every_s=args.status_every or 2.0,
                    shuffle_partitions=args.shuffle_partitions,
                    only=only,
                    autoscale=AutoscalePolicy() if getattr(args, "autoscale", False) else None,
                )
                return SparkRuntime(
                    topology,
                    root,
                    settings,
                    spark=spark,
                    watermarks=wm,
                    log=lambda m: display.message(f"millwheel: {m}"),
                    progress=progress,
                )

            # the log files the driver reads are read while Spark starts (they need no JVM)
            rt = runtime(master) if master is not None else None
            if rt is not None:
                rt.start_readers()
            say(f"starting Spark ({master or 'as spark-submit set it'})...")
            t0 = time.perf_counter()
            jvm_log = os.path.join(root, "spark.log")
            conf = {**_worker_env(topology), **spark_conf(topology, args)}
            spark = spark_session(
                master,
                shuffle_partitions=args.shuffle_partitions,
                ui=ui,
                conf=conf,
                jvm_log=jvm_log,
            )
            where = ui_url(spark)
            say(
                f"Spark {spark.version} up in {time.perf_counter() - t0:.1f}s on {spark.sparkContext.master}"
                + (f"; Spark UI at {where}" if where else "")
            )
            if not under_spark_submit():
                say(f"Spark's own log (its JVM and Python workers): {jvm_log}")
            if rt is None:
                rt = runtime(spark.sparkContext.master, spark)
            else:
                rt.use_session(spark)
            sampler = Sampler(rt, started=time.monotonic() - (time.perf_counter() - started))
            t_start[0] = time.perf_counter()
            rt.start()
            say(
                f"{len(rt.injectors)} injector(s) and {len(rt.computations)} computation(s) started in {time.perf_counter() - t_start[0]:.1f}s; waiting for the first batches"
            )

            def show(_rt: Any) -> None:
                display.show(sampler.sample())  # type: ignore[union-attr]

            try:
                rt.run(timeout_s=args.timeout, on_status=show)
            finally:
                display.close()
            elapsed = time.perf_counter() - started
            final = sampler.sample()
            metrics = {name: dict(q.metrics) for name, q in rt.computations.items()}
            _save_finished(root, topology, only, final, metrics, elapsed)
            _report(
                topology,
                root,
                final,
                metrics,
                on_finish,
                f"topology {topology.name}: ran on Spark in {elapsed:.1f}s",
            )
    finally:
        if metrics_server is not None:
            metrics_server.stop()
    return 0


def _worker_env(topology: Topology) -> dict[str, str]:
    """Ship the topology's code before the JVM starts (local workers inherit ``PYTHONPATH``), and
    put the same import path in the executors' environment: a standalone worker's executors get
    the worker's environment, not the driver's (``_usercode.ship_user_code``)."""
    from millwheel.runtime._usercode import ship_user_code

    ship_user_code(topology)
    path = os.environ.get("PYTHONPATH", "")
    return {"spark.executorEnv.PYTHONPATH": path} if path else {}


def _save_finished(
    root: str,
    topology: Topology,
    only: tuple[str, ...],
    snapshot: Snapshot,
    metrics: dict[str, dict[str, int]],
    elapsed: float,
) -> None:
    """Mark the run finished, with what its report needs (see the module docstring)."""
    data = {
        "topology": topology.name,
        "components": _components(topology, only),
        "finished_at_ms": int(time.time() * 1000),
        "elapsed_s": round(elapsed, 1),
        "rows": [
            {**asdict(r), "in_rate": None, "out_rate": None, "lag_ms": None, "event_lag_ms": None}
            for r in snapshot.rows
        ],
        "metrics": metrics,
        "logs": _log_listing(topology),
    }
    tmp = os.path.join(root, f".{FINISHED}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(root, FINISHED))
