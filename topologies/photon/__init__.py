"""Photon: clicks joined with their queries, exactly once across pipelines (Photon, SIGMOD 2013).

::

    queries ──┐                                           ┌─► joined_clicks  (once_id = click id, §2)
    clicks ───┼─► Joiner (key: query id)                  ┤
    reinjected┘   EventStore cache in state (§3.4.1)      └─► unjoinable     (reason; once_id = click id)
                  LogsEventStore on a miss (§3.4.2)
                  retries with backoff on wall timers (§3.2.1)
                  unjoinable on a low-watermark timer (§3.2.1)
                  adapter: the business logic (§3.3.1)

Several pipelines — one per datacenter — read the same logs and share one IdRegistry
(§2, Fig. 6): each joined click is written by exactly one of them, a pipeline killed
mid-run leaves the others going, and :mod:`.verify` recovers what a dead pipeline
registered but never wrote (§3.3.3).

The package, one module per job: :mod:`.config` (the settings), :mod:`.joiner` (the
computation, :class:`Adapter`), :mod:`.eventstore` (the LogsEventStore),
:mod:`.topology` (:func:`build`, ``make_sources``, :func:`on_finish`), :mod:`.generator`
(the seeded sample), :mod:`.evaluation` (against a batch join in pandas), :mod:`.drivers`
(harness replay, a Spark pipeline), :mod:`.registry` (the IdRegistry client as the
backends use it), :mod:`.verify`, :mod:`.cli` (``millwheel photon``). See ``docs/photon.md``.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = generate(d, GeneratorConfig(duration_s=10, rate=50))
>>> result = replay(d, mode="batch")
>>> evaluate(result, d)["ok"]
True
"""

from __future__ import annotations

from .config import GeneratorConfig, PhotonConfig
from .drivers import read_run, replay, run_spark
from .evaluation import RunResult, batch_join, evaluate, render
from .generator import ensure_sample, generate, load_truth
from .joiner import Adapter, Joiner
from .topology import build, join_topology, make_sources, on_finish
from .verify import Pipeline, verify
from .verify_runs import verify_runs

__all__ = [
    "Adapter",
    "GeneratorConfig",
    "Joiner",
    "PhotonConfig",
    "Pipeline",
    "RunResult",
    "batch_join",
    "build",
    "ensure_sample",
    "evaluate",
    "generate",
    "join_topology",
    "load_truth",
    "make_sources",
    "on_finish",
    "read_run",
    "render",
    "replay",
    "run_spark",
    "verify",
    "verify_runs",
]
