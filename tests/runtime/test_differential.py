"""Differential test: every built-in computation gives the same productions and final state
in the harness and on local Spark (docs/architecture.md, "One semantics, two backends").

The Zeitgeist topology exercises all of them — WindowCounter (low-watermark timers),
ModelCalculator, SpikeDetector (two inputs, no timers), DipDetector (a timer per bucket) —
on a small generated log with duplicates, late records and malformed lines, read by the
runtime's ``LogFileSource``. Productions are compared as multisets of (timestamp, value)
with wall-clock fields removed, their ids unique in each run (ids are a run's own: a key's
life is named by the batch or round that started it, ``millwheel/_identity.py``); states
key by key.

``WindowCounter`` reads ``self.low_watermark`` in ``process_timer`` (no trailing empty
buckets once the input is finished), so its output depends on the values the low
watermark moves through, not only on the data: the Spark run uses ``lockstep=True``,
which releases each source batch once every computation has caught up, as the
harness's ``run_sources`` does. Free-running, the same topology gives the same dips and
evaluation (``tests/topologies/zeitgeist/test_spark.py``).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter

import pytest

from millwheel import LogFileSource, Stage
from millwheel._counters import StepMetrics
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.testing import Harness
from topologies.zeitgeist import GeneratorConfig, ZeitgeistConfig, build, generate, logs_dir

pytestmark = pytest.mark.spark

GEN = GeneratorConfig(
    seed=5,
    duration_s=40,
    rate=250,
    queries=25,
    day_s=20,
    warmup_s=22,
    spikes=1,
    dips=1,
    anomaly_gap_s=4,
    late_fraction=3e-4,
    duplicate_fraction=0.01,
    file_ms=4_000,
)
CFG = ZeitgeistConfig(day_ms=20_000, slot_ms=2_000)
WALL_CLOCK_FIELDS = ("detected_at", "low_watermark")


def _norm(value):
    if hasattr(value, "columns"):  # a columnar computation's state rows (the harness's frame)
        rows = value.drop(columns=["key"]).to_dict("records")
        return _norm(rows[0]) if len(rows) == 1 else tuple(_norm(r) for r in rows)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _norm(dataclasses.asdict(value))
    if isinstance(value, dict):
        return tuple(
            sorted(
                (k, _norm(pickle.loads(v) if k == "data" and isinstance(v, bytes) else v))
                for k, v in value.items()
                if k not in WALL_CLOCK_FIELDS
            )
        )
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    if isinstance(value, float):
        return round(value, 9)
    return value


def _multiset(records):
    """Productions by timestamp and value. Their ids are a run's own (a key's life is named by
    the batch that started it, ``millwheel/_identity.py``), so not the same on both backends:
    checked unique in each run instead."""
    records = list(records)
    assert len({r.id for r in records}) == len(records), "a production id given twice"
    return Counter((r.timestamp, _norm(r.value)) for r in records)


# per-key rows: slow (-m slow); in CI the conformance suite runs that plan against its
# reference model (tests/conformance/test_spark.py, per-record/keys)
@pytest.fixture(scope="module", params=["intervals", pytest.param("keys", marks=pytest.mark.slow)])
def runs(request, tmp_path_factory, spark):
    """Both state layouts (``RuntimeSettings.state_layout``) against the same harness run."""
    base = tmp_path_factory.mktemp(f"differential-{request.param}")
    generate(base / "data", GEN)

    # the per-key layout runs per-record computations only: Zeitgeist's columnar counter, model
    # and spike detector (its defaults) stay on interval rows, so that layout compares the per-record ones
    cfg = (
        CFG
        if request.param == "intervals"
        else dataclasses.replace(
            CFG, columnar_counter=False, columnar_detector=False, columnar_model=False
        )
    )

    def topology():
        return build(
            base / "data", config=cfg, source=LogFileSource(logs_dir(base / "data"), finite=True)
        )

    h = Harness(topology(), raise_errors=False)
    h.run_sources()
    rt = SparkRuntime(
        topology(),
        str(base / "run"),
        RuntimeSettings(drain=True, intervals=4, lockstep=True, state_layout=request.param),
        spark=spark,
    )
    rt.run(timeout_s=600)
    return h, rt


@pytest.mark.parametrize("stream", ["window_counts", "window_models"])
def test_same_productions(runs, stream):
    h, rt = runs
    expected, got = _multiset(h.output(stream)), _multiset(rt.output(stream))
    assert sum(expected.values()) > 100
    assert got == expected


def test_same_dips(runs):
    # spikes depend on when model snapshots reach SpikeDetector relative to raw events
    # (arrival order), dips only on complete windows
    h, rt = runs

    def dips(records):
        return _multiset(r for r in records if r.value["kind"] == "dip")

    assert dips(rt.output("anomalies")) == dips(h.output("anomalies"))
    assert sum(dips(h.output("anomalies")).values()) > 0


@pytest.mark.parametrize("computation", ["WindowCounter", "ModelCalculator", "DipDetector"])
def test_same_final_state(runs, computation):
    h, rt = runs
    expected = {
        k: _norm(h.state(computation, k))
        for k in h.keys(computation)
        if h.state(computation, k) is not None
    }
    got = {k: _norm(v) for k, v in rt.states(computation).items()}
    assert got == expected


#: counters that depend on how input is cut into steps (a harness round, a Spark batch)
#: and on how far the watermark had moved when a step ran, not only on the input: how
#: often dedup ids are collected, how many ids the Bloom filter could not rule out, how
#: many productions were older than the watermark of their step; SpikeDetector's output
#: depends on arrival order (see test_same_dips)
STEP_SHAPED = {
    "dedup_gc_runs",
    "dedup_ids_collected",
    "bloom_maybe",
    "bloom_false_positive",
    "productions_behind_watermark",
}


def test_same_counters_and_dead_letters(runs):
    h, rt = runs
    for name in ("WindowCounter", "ModelCalculator", "SpikeDetector", "DipDetector"):
        hm, sm = h.metrics(name), StepMetrics.of(rt.computations[name].metrics).as_dict()
        assert set(hm) == set(sm) == set(StepMetrics.names())  # every counter on both backends
        for counter in StepMetrics.names():
            if counter in STEP_SHAPED or (name == "SpikeDetector" and counter == "productions"):
                continue
            assert sm[counter] == hm[counter], (name, counter)
    # dedup works on both: ids are kept and collected behind the watermark
    assert h.metrics("WindowCounter")["dedup_ids_collected"] > 0
    assert rt.computations["WindowCounter"].metrics["dedup_ids_collected"] > 0
    malformed = [r.value for r in rt.dead_letters() if r.value.stage == Stage.MALFORMED]
    assert len(malformed) == GEN.malformed
    assert all(v.reason and v.file and v.offset is not None for v in malformed)
    # the harness makes the same dead letters of the same lines
    assert sorted(r.id for r in rt.dead_letters()) == sorted(r.id for r in h.dead_letters())
