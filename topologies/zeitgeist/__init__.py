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

The package, one module per job: :mod:`.config` (the settings), :mod:`.topology`
(:func:`build`, ``make_source``, :func:`on_finish`), :mod:`.generator` (the seeded sample
and its ground truth), :mod:`.evaluation`, :mod:`.drivers` (harness replay, Spark run),
:mod:`.cli` (``millwheel zeitgeist``, registered as an entry point).
``millwheel run topologies/zeitgeist`` runs :func:`build` on the default generated sample
and prints :func:`on_finish`'s evaluation; ``millwheel zeitgeist run`` replays it in
continuous mode. See ``docs/zeitgeist.md``.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = generate(d, GeneratorConfig(duration_s=20, rate=200, queries=20, spikes=0, dips=0))
>>> t = build(d)
>>> print(t.name, sorted(t.computations))
zeitgeist ['DipDetector', 'ModelCalculator', 'SpikeDetector', 'WindowCounter']
"""

from __future__ import annotations

from .config import GeneratorConfig, ZeitgeistConfig
from .drivers import replay, run_spark
from .evaluation import RunResult, evaluate, load_truth, render
from .generator import ensure_sample, generate, logs_dir
from .topology import SAMPLE_SPARK_CONF, build, make_source, on_finish

__all__ = [
    "SAMPLE_SPARK_CONF",
    "GeneratorConfig",
    "RunResult",
    "ZeitgeistConfig",
    "build",
    "ensure_sample",
    "evaluate",
    "generate",
    "load_truth",
    "logs_dir",
    "make_source",
    "on_finish",
    "render",
    "replay",
    "run_spark",
]
