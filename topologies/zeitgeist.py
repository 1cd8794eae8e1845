"""Zeitgeist: spike and dip detection on search queries (MillWheel §2, Fig. 1, Fig. 2, Fig. 9).

::

    queries ──► WindowCounter ──window_counts──► ModelCalculator ──window_models──┬─► DipDetector ──┐
       │        (per query, 1 s buckets,         (per query, seasonal model,      │   (LW timer per │
       │         LW timer per bucket)             long-term state)                │    bucket)      ├─► anomalies
       └──────────────────────────────────────────────────────────────────► SpikeDetector ───────┘
                                                                               (no timers)

* ``WindowCounter`` counts each query's events per 1-second bucket and emits a bucket once
  the low watermark has passed it (Fig. 9 ``Windower``, §4.6); late records (behind the
  injector low watermark) are dropped and counted (§4.5: Zeitgeist drops late data).
* ``ModelCalculator`` keeps a per-query model of expected traffic for the long term (§2)
  and attaches the prediction and a model snapshot to every window.
* ``SpikeDetector`` reads the raw events as they arrive and the model snapshots: a spike
  is evident before the bucket is complete, so it uses no timers (§4.6).
* ``DipDetector`` judges a bucket only once the low watermark has passed it, with a
  low-watermark timer per bucket (§2, §4.6, Fig. 9).

``millwheel run topologies/zeitgeist.py`` runs :func:`build` on the default generated
sample (``topologies/zeitgeist_tools.py`` generates it on first use);
``python -m topologies.zeitgeist_tools run`` replays it in continuous mode and prints
the evaluation. See ``docs/zeitgeist.md``.

>>> import tempfile
>>> from topologies.zeitgeist_tools import GeneratorConfig, generate
>>> d = tempfile.mkdtemp()
>>> _ = generate(d, GeneratorConfig(duration_s=20, rate=200, queries=20, spikes=0, dips=0))
>>> print(build(d).name, sorted(build(d).computations))
zeitgeist ['DipDetector', 'ModelCalculator', 'SpikeDetector', 'WindowCounter']
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from computations.anomalies import ANOMALIES, DipDetector, SpikeDetector
from computations.model import ModelCalculator
from computations.windowing import WindowCounter
from millwheel import ComputationOptions, DedupOptions, LatePolicy, LogFileSource, Source, Topology

# ZeitgeistConfig lives in zeitgeist_tools: `millwheel run` imports this file without
# registering it in sys.modules, where @dataclass needs to find its module
from topologies.zeitgeist_tools import ZeitgeistConfig, ensure_sample, logs_dir

__all__ = ["ZeitgeistConfig", "build", "make_source", "on_finish"]


def make_source(data_dir: str | os.PathLike[str]) -> Source:
    """The query-log injector source: the one place to switch to the Spark runtime's file source."""
    # the log-file injector: Fig. 10 watermark; malformed lines go to dead_letters
    return LogFileSource(logs_dir(data_dir), id_field="id", ts_field="ts", finite=True)


def build(data_dir: str | os.PathLike[str] | None = None, *, config: ZeitgeistConfig | None = None, source: Source | None = None) -> Topology:
    """The Zeitgeist topology reading ``data_dir`` (default: the default sample, generated if missing)."""
    cfg = config or ZeitgeistConfig()
    if source is None:
        source = make_source(ensure_sample(data_dir))
    options = ComputationOptions(
        late=LatePolicy.drop(),
        dedup=DedupOptions(slack_ms=cfg.dedup_slack_ms, gc_interval_ms=max(1_000, cfg.dedup_slack_ms // 6)),
    )
    by_query = {"queries": lambda r: r.value["query"]}
    by_key = {"window_models": lambda r: r.value["key"]}
    t = Topology("zeitgeist")
    t.injector("queries", source)
    t.computation(
        WindowCounter,
        inputs={"queries": lambda r: r.value["query"]},
        outputs=["window_counts"],
        options=options,
        params={"window_ms": cfg.window_ms, "trailing_empty": cfg.trailing_empty},
    )
    t.computation(
        ModelCalculator,
        inputs={"window_counts": lambda r: r.value["key"]},
        outputs=["window_models"],
        options=options,
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
        SpikeDetector,
        inputs={**by_query, **by_key},
        outputs=[ANOMALIES],
        options=options,
        params={"thresholds": cfg.thresholds, "window_ms": cfg.window_ms},
    )
    t.computation(
        DipDetector,
        inputs=by_key,
        outputs=[ANOMALIES],
        options=options,
        params={"thresholds": cfg.thresholds, "window_ms": cfg.window_ms},
    )
    t.sink(ANOMALIES)
    return t


def on_finish(topology: Topology, streams: Mapping[str, list[Any]], metrics: Mapping[str, Mapping[str, int]], *, wall_clock: bool = False) -> str:
    """The evaluation of a finished run, as text: for ``millwheel run`` to print after the run.

    ``streams`` maps stream names to their values (at least ``anomalies`` and
    ``dead_letters``), ``metrics`` computation names to their counters.
    """
    from topologies.zeitgeist_tools import RunResult, evaluate, load_truth, render

    source = topology.injectors["queries"].source
    directory = getattr(source, "path", None)
    if directory is None:
        return "zeitgeist: no ground truth for this source; nothing to evaluate"
    dead = [v.as_dict() if hasattr(v, "as_dict") else {"value": v} for v in streams.get("dead_letters", [])]
    result = RunResult([dict(a) for a in streams.get(ANOMALIES, [])], {k: dict(v) for k, v in metrics.items()}, dead, wall_clock=wall_clock)
    return render(evaluate(result, load_truth(directory)))
