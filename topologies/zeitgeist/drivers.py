"""Running Zeitgeist for its evaluation: a replay in the harness (continuous or batch) and on Spark.

Both read the topology's own :class:`millwheel.LogFileSource` and return a
:class:`~.evaluation.RunResult`; malformed lines reach the evaluation the same way on
both backends, as records of the ``dead_letters`` stream.

**Continuous replay** simulates a live deployment: the wall clock is the event clock, each
log file is delivered over the wall-time interval in which it was written (its lines
spread evenly, every ``tick_ms``), and the injector low watermark is the oldest unfinished
file's time (Fig. 10), so it lags wall time by ``max_delay_ms`` plus up to one file.
Processing is instantaneous: delays measure how long the data and the low watermark make
detection wait, not CPU. **Batch replay** (and ``millwheel run --backend harness``) feeds
the files as fast as possible with a fixed wall clock: no delay figures. **Spark** is not
paced either.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from millwheel import MAX_TIMESTAMP, LogFileSource, Source, SourceBatch, Topology
from millwheel.testing import Harness

from .evaluation import RunResult, load_truth

__all__ = ["replay", "run_spark"]


def replay(
    topology: Topology, *, injector: str = "queries", tick_ms: int = 100, mode: str = "continuous"
) -> RunResult:
    """Run ``topology`` in the harness on its log-file source; ``mode`` is ``continuous`` or ``batch``."""
    if mode not in ("continuous", "batch"):
        msg = f"replay: mode must be 'continuous' or 'batch', got {mode!r}"
        raise ValueError(msg)
    spec = topology.injectors[injector]
    logs = spec.source
    if not isinstance(logs, LogFileSource):
        msg = f"replay needs the injector {injector!r} to read a log directory (a LogFileSource), got {type(logs).__name__}"
        raise TypeError(msg)
    started = time.perf_counter()
    if mode == "batch":
        h = Harness(topology, raise_errors=False)
    else:
        # LogFileSource: one batch per file (records and dead letters), after a watermark-only batch
        files = [b for b in logs.batches(injector, spec.stream) if b.records or b.dead_letters]
        paced = _Paced(files, _written(logs.path), tick_ms)
        h = Harness(
            _with_source(topology, injector, paced),
            wall_time=paced.first_wall_time(),
            raise_errors=False,
        )
        paced.harness = h
    h.run_sources()
    metrics = {name: h.metrics(name) for name in topology.order()}
    dead = [r.value.as_dict() for r in h.dead_letters()]
    anomalies = [dict(v) for v in h.values("anomalies")]
    return RunResult(
        anomalies,
        metrics,
        dead,
        wall_clock=(mode == "continuous"),
        elapsed_s=time.perf_counter() - started,
    )


def run_spark(
    topology: Topology,
    root: str | os.PathLike[str],
    *,
    timeout_s: float = 900,
    settings: Any = None,
) -> RunResult:
    """Run the topology on local Spark (``millwheel.runtime``) until its finite input is drained.

    Not paced: the files are read as fast as Spark goes, so wall time says nothing about
    detection delay (``wall_clock=False``); precision, recall, duplicates, late records and
    dead letters are comparable with :func:`replay` (the differential test).
    """
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    settings = dataclasses.replace(settings or RuntimeSettings(), drain=True)
    started = time.perf_counter()
    rt = SparkRuntime(topology, os.fspath(root), settings)
    rt.run(timeout_s=timeout_s)
    metrics = {name: dict(q.metrics) for name, q in rt.computations.items()}
    dead = [r.value.as_dict() for r in rt.dead_letters()]
    anomalies = [dict(v) for v in rt.values("anomalies")]
    return RunResult(
        anomalies, metrics, dead, wall_clock=False, elapsed_s=time.perf_counter() - started
    )


def _written(directory: str | os.PathLike[str]) -> dict[int, tuple[int, int]]:
    """Each file's time -> the wall-time interval it was written in (from the ground truth, if any)."""
    with contextlib.suppress(FileNotFoundError):
        return {
            f["time_ms"]: (f["written_from_ms"], f["written_to_ms"])
            for f in load_truth(directory)["files"]
        }
    return {}


def _with_source(topology: Topology, injector: str, source: Source) -> Topology:
    """A shallow copy of ``topology`` whose ``injector`` reads ``source``."""
    paced = copy.copy(topology)
    paced.injectors = {
        **topology.injectors,
        injector: dataclasses.replace(topology.injectors[injector], source=source),
    }
    return paced


class _Paced(Source):
    """Log files as they were written: each file's batch cut into ticks over its writing interval.

    A script of the harness as much as a source: ``Harness.run_sources`` runs the topology
    after each batch, and before handing over a file's first tick this moves the injector
    low watermark to the file's time (the oldest unfinished file, Fig. 10), and before
    each tick the harness's wall clock. A file's time is the low watermark
    :class:`~millwheel.LogFileSource` sends its records under; ``written`` maps it to the
    file's writing interval (default: until the next file's time).
    """

    def __init__(
        self, files: list[SourceBatch], written: Mapping[int, tuple[int, int]], tick_ms: int
    ) -> None:
        self.files = files
        self.written = written
        self.tick_ms = tick_ms
        self.harness: Harness | None = None

    def _interval(self, i: int) -> tuple[int, int]:
        t = self.files[i].low_watermark
        nxt = self.files[i + 1].low_watermark if i + 1 < len(self.files) else t + 1_000
        return self.written.get(t, (t, nxt))

    def first_wall_time(self) -> int:
        return self._interval(0)[0] if self.files else 0

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:  # noqa: ARG002
        h = self.harness
        if h is None:
            msg = "_Paced.batches: set .harness to the harness that runs this source"
            raise RuntimeError(msg)
        for i, f in enumerate(self.files):
            w_from, w_to = self._interval(i)
            h.advance_watermark(injector, f.low_watermark)
            ticks = max(1, (w_to - w_from) // self.tick_ms)
            n = len(f.records)
            for j in range(ticks):
                h.advance_wall_time(to=max(h.now, w_from + (j + 1) * (w_to - w_from) // ticks))
                yield SourceBatch(
                    f.records[j * n // ticks : (j + 1) * n // ticks],
                    f.low_watermark,
                    f.dead_letters if j == 0 else [],
                )
        yield SourceBatch([], MAX_TIMESTAMP)
