"""Running Photon: a replay in the harness (paced or batch) and a pipeline on Spark.

**Paced replay** (``replay(..., mode="continuous")``) simulates a live deployment in the
harness: the wall clock is the event clock, each log file of both logs is delivered
over the wall-time interval in which it was written (its lines spread evenly, every
``tick_ms``), and the query log grows on disk as it is delivered, so the LogsEventStore
sees what a live one would. Each injector's low watermark is its file's time minus its
declared lateness (Fig. 10 of MillWheel). Processing is instantaneous: the latency —
click logged → joined output visible — measures how long the data makes the join wait
(a query logged after its click), not CPU. **Batch replay** feeds the files as fast as
possible with a fixed wall clock.

**A pipeline on Spark** (:func:`run_spark`): one Photon pipeline — one datacenter of
Photon §2, Fig. 6 — in a run directory of its own, committing to a shared IdRegistry
under its own name. The run directory holds ``photon.json`` (what verification needs:
the logs, the pipeline, the settings; written once the registry's roster took the directory
as a member, so a start refused under a taken name leaves none), ``reinject/`` (where verification re-injects
clicks for it, §3.3.3) and ``photon.lock``, held while the pipeline runs: an exclusive
``flock``, released by the kernel when the process dies, even by ``kill -9``.
``follow=True`` keeps a drained pipeline running, serving re-injections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from millwheel import DEAD_LETTER_STREAM, MAX_TIMESTAMP, MIN_TIMESTAMP, Source, SourceBatch
from millwheel.testing import Harness

from .config import PhotonConfig
from .evaluation import RunResult
from .generator import has_truth, load_truth
from .joiner import JOINED, UNJOINABLE, Adapter
from .topology import build, join_topology, make_sources

__all__ = [
    "PipelineBusyError",
    "check_run",
    "prepare_run",
    "read_run",
    "replay",
    "run_lock",
    "run_spark",
]

#: files of a pipeline's run directory
MANIFEST = "photon.json"
LOCK = "photon.lock"
STATUS = "photon-status.json"
REINJECT = "reinject"


# ---------------------------------------------------------------------------------- harness
def replay(
    data_dir: str | os.PathLike[str],
    *,
    config: PhotonConfig | None = None,
    mode: str = "continuous",
    tick_ms: int = 100,
    registry: Any = None,
    pipeline: str = "harness",
    adapter: Adapter | None = None,
) -> RunResult:
    """Run Photon on a sample in the harness (see the module docstring); ``registry``: a shared
    once-registry (default: a fresh in-memory one) and ``pipeline`` this pipeline's name."""
    if mode not in ("continuous", "batch"):
        msg = f"replay: mode must be 'continuous' or 'batch', got {mode!r}"
        raise ValueError(msg)
    if mode == "continuous" and not has_truth(data_dir):
        msg = f"replay: a paced replay needs a generated sample's record of when each file was written (ground_truth.json), and {os.fspath(data_dir)} has none: use mode='batch'"
        raise ValueError(msg)
    c = config or PhotonConfig()
    started = time.perf_counter()
    if mode == "batch":
        h = Harness(
            build(data_dir, config=c, adapter=adapter),
            raise_errors=False,
            registry=registry,
            pipeline=pipeline,
        )
        h.run_sources()
        return _result(h, None, started)
    with tempfile.TemporaryDirectory(prefix="photon-live-") as live:
        pacer = _Pacer(Path(data_dir), c, Path(live), tick_ms)
        t = join_topology(
            c,
            sources={name: pacer.source(name) for name in pacer.logs},
            queries_dir=Path(live) / "queries",
            adapter=adapter,
        )
        h = Harness(
            t,
            wall_time=pacer.first_wall_time(),
            raise_errors=False,
            registry=registry,
            pipeline=pipeline,
        )
        pacer.harness = h
        h.run_sources()
        pacer.stamp()
        logged = load_truth(data_dir)["click_logged_ms"]
        latencies = [pacer.visible[cid] - logged[cid] for cid in pacer.visible if cid in logged]
        return _result(h, latencies, started)


def _result(h: Harness, latencies: list[int] | None, started: float) -> RunResult:
    return RunResult(
        [dict(v) for v in h.values(JOINED)],
        [dict(v) for v in h.values(UNJOINABLE)],
        [r.value.as_dict() for r in h.dead_letters()],
        {name: h.metrics(name) for name in h.topology.order()},
        latencies_ms=latencies,
        elapsed_s=time.perf_counter() - started,
    )


class _Pacer:
    """Both logs as they were written: one timeline of ticks, shared by the two injectors' sources.

    ``Harness.run_sources`` asks each injector for a batch in turn and runs the topology
    after each: a source whose log does not own the next tick answers an empty batch, so
    the two logs advance on one wall clock. Before each tick the pacer stamps the joined
    outputs that became visible since the last one with the wall time they appeared at.
    """

    def __init__(self, data_dir: Path, config: PhotonConfig, live: Path, tick_ms: int) -> None:
        truth = load_truth(data_dir)
        sources = make_sources(
            data_dir, dataclasses.replace(config, max_bytes_per_batch=1 << 40)
        )  # a file a batch
        self.logs = list(sources)
        self.live = live
        self.files: dict[str, list[SourceBatch]] = {}
        self.names: dict[str, list[str]] = {}
        events: list[tuple[int, int, str, int, int, int]] = []
        for order, (log, src) in enumerate(sources.items()):
            batches = [b for b in src.batches(log, log) if b.records or b.dead_letters]
            written = truth["files"][log]
            if len(batches) != len(written):
                msg = f"replay: {len(batches)} batches for {len(written)} files of the {log} log; the ground truth does not describe these logs"
                raise ValueError(msg)
            self.files[log] = batches
            self.names[log] = [w["name"] for w in written]
            for i, w in enumerate(written):
                w_from, w_to = w["written_from_ms"], w["written_to_ms"]
                ticks = max(1, (w_to - w_from) // tick_ms)
                events += [
                    (w_from + (j + 1) * (w_to - w_from) // ticks, order, log, i, j, ticks)
                    for j in range(ticks)
                ]
        events.sort()
        self.events = events
        self.pos = 0
        self.harness: Harness | None = None
        self.wm = dict.fromkeys(self.logs, MIN_TIMESTAMP)
        self.visible: dict[str, int] = {}
        self._seen = 0
        (live / "queries").mkdir(parents=True, exist_ok=True)

    def first_wall_time(self) -> int:
        return self.events[0][0] if self.events else 0

    def stamp(self) -> None:
        h = self.harness
        out = h.output(JOINED)  # type: ignore[union-attr]
        for rec in out[self._seen :]:
            self.visible.setdefault(rec.value["click_id"], h.now)  # type: ignore[union-attr]
        self._seen = len(out)

    def source(self, log: str) -> Source:
        pacer = self

        class _Log(Source):
            def batches(self, injector: str = log, stream: str = log) -> Iterator[SourceBatch]:  # noqa: ARG002
                yield from pacer._batches(log)

        return _Log()

    def _batches(self, log: str) -> Iterator[SourceBatch]:
        h = self.harness
        if h is None:
            msg = "_Pacer: set .harness to the harness that runs it"
            raise RuntimeError(msg)
        while self.pos < len(self.events):
            self.stamp()
            t, _, owner, i, j, ticks = self.events[self.pos]
            if owner != log:
                yield SourceBatch([], self.wm[log])
                continue
            self.pos += 1
            f = self.files[log][i]
            if j == 0:
                self.wm[log] = max(self.wm[log], f.low_watermark)
                h.advance_watermark(log, self.wm[log])
            h.advance_wall_time(to=max(h.now, t))
            n = len(f.records)
            recs = f.records[j * n // ticks : (j + 1) * n // ticks]
            if log == "queries" and recs:  # the query log grows on disk as it is delivered
                with open(self.live / "queries" / self.names[log][i], "a", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(r.value) + "\n" for r in recs)
            yield SourceBatch(recs, self.wm[log], f.dead_letters if j == 0 else [])
        yield SourceBatch([], MAX_TIMESTAMP)


# ------------------------------------------------------------------------------------ Spark
class PipelineBusyError(RuntimeError):
    """Another process runs this pipeline (it holds the run directory's lock)."""


@contextlib.contextmanager
def run_lock(root: str | os.PathLike[str], *, wait: bool = False) -> Iterator[None]:
    """Hold the run directory's lock (see the module docstring); :class:`PipelineBusyError` if taken."""
    Path(root).mkdir(parents=True, exist_ok=True)
    fd = os.open(os.path.join(root, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            msg = f"the pipeline in {os.fspath(root)} is running, or being verified (another process holds {LOCK})"
            raise PipelineBusyError(msg) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def check_run(root: str | os.PathLike[str], pipeline: str) -> Path:
    """Refuse a run directory whose manifest names another pipeline; write nothing."""
    run = Path(root)
    old = read_manifest(run)
    if old is not None and old["pipeline"] != pipeline:
        msg = f"run directory {run} belongs to pipeline {old['pipeline']!r}, not {pipeline!r}"
        raise ValueError(msg)
    return run


def prepare_run(
    root: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    config: PhotonConfig,
    pipeline: str,
    registry_url: str | None,
) -> Path:
    """Write the run directory's manifest and its (complete, empty) re-injection directory.

    :func:`run_spark` calls it once the registry's roster has taken the run directory as a
    member: a start refused under a taken name leaves no manifest, so verification never
    takes the directory for a pipeline.
    """
    run = check_run(root, pipeline)
    (run / REINJECT).mkdir(parents=True, exist_ok=True)
    (
        run / REINJECT / "_DONE"
    ).touch()  # the injector's watermark is +inf: re-injected clicks hold nothing
    manifest = {
        "data_dir": os.fspath(Path(data_dir).resolve()),
        "pipeline": pipeline,
        "registry": registry_url,
        "config": dataclasses.asdict(config),
    }
    tmp = run / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, run / MANIFEST)
    return run


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        return dict(json.loads((Path(root) / MANIFEST).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def run_spark(
    data_dir: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    config: PhotonConfig | None = None,
    settings: Any = None,
    pipeline: str = "dc1",
    registry: Any = None,
    registry_url: str | None = None,
    watermarks: Any = None,
    adapter: Adapter | None = None,
    follow: bool = False,
    finite: bool = True,
    timeout_s: float | None = 900,
    stop: threading.Event | None = None,
    log: Any = None,
) -> RunResult:
    """Run one Photon pipeline on local Spark in ``root`` (see the module docstring).

    ``registry``: a picklable zero-argument factory of the IdRegistry client (e.g.
    :class:`~.registry.RegistryFactory`); ``registry_url`` is recorded for verification.
    ``watermarks``: a watermark authority's client (default: one in this process).
    Returns once the logs are drained (``finite``), or, with ``follow``, once ``stop`` is
    set; a finite run that does not drain within ``timeout_s`` raises.
    """
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    c = config or PhotonConfig()
    started = time.perf_counter()
    run = check_run(root, pipeline)
    with run_lock(run):
        t = build(data_dir, config=c, adapter=adapter, reinject_dir=run / REINJECT, finite=finite)
        settings = dataclasses.replace(
            settings or RuntimeSettings(), drain=finite, pipeline=pipeline, registry=registry
        )
        rt = SparkRuntime(t, os.fspath(run), settings, watermarks=watermarks, log=log)
        rt.claim()  # the roster takes this directory as a member (or refuses its name) before it looks like a run
        prepare_run(run, data_dir, c, pipeline, registry_url)
        _write_status(run, pipeline, drained=False)
        try:
            rt.start()
            drained = False
            while True:
                rt.poll()
                if not drained and rt.drained():
                    drained = True
                    _write_status(run, pipeline, drained=True)
                if (drained and not follow) or (stop is not None and stop.is_set()):
                    break
                if (
                    timeout_s is not None
                    and not drained
                    and time.perf_counter() - started > timeout_s
                ):
                    msg = f"photon pipeline {pipeline!r} did not drain within {timeout_s}s: {rt.status()}"
                    raise TimeoutError(msg)
                time.sleep(settings.poll_ms / 1000)
            metrics = {name: dict(q.metrics) for name, q in rt.computations.items()}
        finally:
            rt.stop()
    result = read_run(run)
    result.metrics, result.elapsed_s = metrics, time.perf_counter() - started
    return result


def _write_status(run: Path, pipeline: str, *, drained: bool) -> None:
    tmp = run / f".{STATUS}.tmp"
    tmp.write_text(
        json.dumps(
            {
                "pipeline": pipeline,
                "pid": os.getpid(),
                "drained": drained,
                "at_ms": int(time.time() * 1000),
            }
        )
    )
    os.replace(tmp, run / STATUS)


def read_run(root: str | os.PathLike[str]) -> RunResult:
    """The visible output of a pipeline's run directory (committed, published files only)."""
    from millwheel.runtime import FileStreamLog

    streams = FileStreamLog.at(os.fspath(root))

    def values(stream: str) -> list[Any]:
        return [r.value for r in streams.read(stream)]

    metrics: dict[str, dict[str, int]] = {}
    tallies = Path(root) / "tallies"
    for path in sorted(tallies.glob("*.json")) if tallies.is_dir() else []:
        if not path.name.startswith("injector."):
            metrics[path.stem] = json.loads(path.read_text()).get("metrics", {})
    dead = [v.as_dict() if hasattr(v, "as_dict") else v for v in values(DEAD_LETTER_STREAM)]
    return RunResult(
        [dict(v) for v in values(JOINED)], [dict(v) for v in values(UNJOINABLE)], dead, metrics
    )
