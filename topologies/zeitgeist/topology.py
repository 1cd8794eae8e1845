"""The Zeitgeist topology (MillWheel §2, Fig. 1, Fig. 9): :func:`build`, its source, its ``on_finish``.

``millwheel run topologies/zeitgeist`` imports the package, calls :func:`build` (the
default sample, generated on first use) and prints :func:`on_finish` once the run has
drained its input.

>>> from millwheel import SampleSource
>>> t = build(source=SampleSource([]))
>>> t.order()
['WindowCounter', 'ModelCalculator', 'SpikeDetector', 'DipDetector']
>>> on_finish(t, {}, {})
'zeitgeist: no ground truth for this source; nothing to evaluate'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from computations.anomalies import ANOMALIES, DipDetector, SpikeDetector
from computations.columnar_anomalies import ColumnarDipDetector, ColumnarSpikeDetector
from computations.columnar_model import ColumnarModelCalculator
from computations.columnar_windowing import ColumnarWindowCounter
from computations.model import ModelCalculator
from computations.windowing import WindowCounter
from millwheel import (
    DEAD_LETTER_STREAM,
    ComputationOptions,
    DedupOptions,
    LatePolicy,
    LogFileSource,
    Source,
    Topology,
)

from .config import ZeitgeistConfig
from .evaluation import RunResult, evaluate, load_truth, render
from .generator import ensure_sample, logs_dir

__all__ = ["SAMPLE_SPARK_CONF", "build", "make_source", "on_finish"]

#: Spark settings of a run on the bundled sample (``build()`` without ``data_dir`` or
#: ``source``): a finite ~30 s run, for which the JVM's client compiler alone and the serial
#: collector leave both cores of a small machine to the work instead of the C2 compiler's
#: and G1's threads (docs/performance.md, "The main job"). Not for a directory of your own,
#: which may be a long stream where C2's code pays off; ``$MILLWHEEL_JAVA_OPTIONS`` comes
#: after these, so ``-XX:TieredStopAtLevel=4`` there gives the sample run C2 back.
SAMPLE_SPARK_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def make_source(data_dir: str | os.PathLike[str]) -> LogFileSource:
    """The query-log injector source, for both backends: the one place that names it.

    :class:`millwheel.LogFileSource`: the injector low watermark is the oldest unfinished
    file's time (Fig. 10); malformed lines go to ``dead_letters`` with file and offset.
    """
    return LogFileSource(logs_dir(data_dir), id_field="id", ts_field="ts", finite=True)


def build(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    config: ZeitgeistConfig | None = None,
    source: Source | None = None,
) -> Topology:
    """The Zeitgeist topology reading ``data_dir`` (default: the default sample, generated if missing)."""
    cfg = config or ZeitgeistConfig()
    bundled = data_dir is None and source is None
    if source is None:
        source = make_source(ensure_sample(data_dir))
    options = ComputationOptions(
        late=LatePolicy.drop(),
        dedup=DedupOptions(
            slack_ms=cfg.dedup_slack_ms, gc_interval_ms=max(1_000, cfg.dedup_slack_ms // 6)
        ),
    )
    columnar = dataclasses.replace(options, mapping=cfg.mapping)
    by_query = {"queries": lambda r: r.value["query"]}
    by_key = {"window_models": lambda r: r.value["key"]}
    t = Topology("zeitgeist", spark_conf=SAMPLE_SPARK_CONF if bundled else None)
    t.injector("queries", source)
    # a log line as the generator writes it: stored as columns, so the counter (which reads
    # no values) shuffles none, and the spike detector reads them without unpickling
    t.stream("queries", fields={"id": str, "ts": int, "query": str})
    t.computation(
        ColumnarWindowCounter if cfg.columnar_counter else WindowCounter,
        name="WindowCounter",
        inputs={"queries": lambda r: r.value["query"]},
        outputs=["window_counts"],
        options=columnar if cfg.columnar_counter else options,
        params={"window_ms": cfg.window_ms, "trailing_empty": cfg.trailing_empty},
    )
    t.computation(
        ColumnarModelCalculator if cfg.columnar_model else ModelCalculator,
        name="ModelCalculator",
        inputs={"window_counts": lambda r: r.value["key"]},
        outputs=["window_models"],
        options=columnar if cfg.columnar_model else options,
        params={
            "day_ms": cfg.day_ms,
            "slot_ms": cfg.slot_ms,
            "alpha": cfg.model_alpha,
            "gamma": cfg.model_gamma,
            "warmup_windows": cfg.model_warmup_windows,
            "window_ms": cfg.window_ms,
        },
    )
    t.computation(
        ColumnarSpikeDetector if cfg.columnar_detector else SpikeDetector,
        name="SpikeDetector",
        inputs={**by_query, **by_key},
        outputs=[ANOMALIES],
        options=columnar if cfg.columnar_detector else options,
        params={"thresholds": cfg.thresholds, "window_ms": cfg.window_ms},
    )
    t.computation(
        ColumnarDipDetector if cfg.columnar_detector else DipDetector,
        name="DipDetector",
        inputs=by_key,
        outputs=[ANOMALIES],
        options=columnar if cfg.columnar_detector else options,
        params={"thresholds": cfg.thresholds, "window_ms": cfg.window_ms},
    )
    t.sink(ANOMALIES)
    return t


def on_finish(
    topology: Topology,
    streams: Mapping[str, list[Any]],
    metrics: Mapping[str, Mapping[str, int]],
    *,
    wall_clock: bool = False,
) -> str:
    """The evaluation of a finished run, as text: for ``millwheel run`` to print after the run.

    ``streams`` maps stream names to their values (at least ``anomalies`` and
    ``dead_letters``, whose values are :class:`millwheel.DeadLetter`), ``metrics``
    computation names to their counters.
    """
    directory = getattr(topology.injectors["queries"].source, "path", None)
    if directory is None:
        return "zeitgeist: no ground truth for this source; nothing to evaluate"
    dead = [v.as_dict() for v in streams.get(DEAD_LETTER_STREAM, [])]
    anomalies = [dict(a) for a in streams.get(ANOMALIES, [])]
    result = RunResult(
        anomalies, {k: dict(v) for k, v in metrics.items()}, dead, wall_clock=wall_clock
    )
    return render(evaluate(result, load_truth(directory)))
