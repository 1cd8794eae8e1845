"""Zeitgeist with its window counter, model calculator and spike detector on the columnar path
(the defaults) against the per-record ones (``ZeitgeistConfig(columnar_counter=False)``,
``columnar_model=False``, ``columnar_detector=False``), one at a time: the same window counts,
models and anomalies (ids included), counters and evaluation, in the harness, on a generated
sample with spikes, dips, duplicates, late records and malformed lines."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from millwheel import LogFileSource
from millwheel.testing import Harness
from topologies.zeitgeist import (
    GeneratorConfig,
    RunResult,
    ZeitgeistConfig,
    build,
    evaluate,
    generate,
    load_truth,
    logs_dir,
)

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


#: the counters both forms keep alike (how often dedup ids are collected, and what the Bloom
#: filter says, follow how a form keeps its ids, not the input)
COUNTERS = (
    "records_in",
    "duplicates",
    "late",
    "late_dropped",
    "processed",
    "productions",
    "dead_letters",
)


def _run(d, cfg):
    h = Harness(
        build(d, config=cfg, source=LogFileSource(logs_dir(d), finite=True)), raise_errors=False
    )
    h.run_sources()
    return h


def _multiset(records):
    return Counter(
        (r.id, r.timestamp, json.dumps(r.value, sort_keys=True, default=str)) for r in records
    )


def test_columnar_counter_gives_the_same_zeitgeist(tmp_path):
    generate(tmp_path / "data", GEN)
    per_record = _run(tmp_path / "data", dataclasses.replace(CFG, columnar_counter=False))
    columnar = _run(tmp_path / "data", CFG)
    assert type(per_record._runners["WindowCounter"].computation).__name__ == "WindowCounter"
    assert type(columnar._runners["WindowCounter"].computation).__name__ == "ColumnarWindowCounter"
    for stream in ("window_counts", "window_models"):
        expected = _multiset(per_record.output(stream))
        assert sum(expected.values()) > 100
        assert _multiset(columnar.output(stream)) == expected, stream
    drop = ("detected_at", "low_watermark")
    anomalies = [
        Counter(
            json.dumps({k: v for k, v in a.items() if k not in drop}, sort_keys=True, default=str)
            for a in h.values("anomalies")
        )
        for h in (per_record, columnar)
    ]
    assert anomalies[0] == anomalies[1] and sum(anomalies[0].values()) >= 2
    a, b = per_record.metrics("WindowCounter"), columnar.metrics("WindowCounter")
    for name in COUNTERS:
        assert a[name] == b[name], name
    assert a["duplicates"] > 0


@pytest.mark.parametrize(
    ("flag", "computation", "classes"),
    [
        ("columnar_detector", "SpikeDetector", ["SpikeDetector", "ColumnarSpikeDetector"]),
        ("columnar_detector", "DipDetector", ["DipDetector", "ColumnarDipDetector"]),
        (
            "columnar_model",
            "ModelCalculator",
            ["ModelCalculator", "ColumnarModelCalculator"],
        ),
    ],
)
def test_the_columnar_model_and_detector_give_the_same_anomalies(
    tmp_path, flag, computation, classes
):
    """The model calculator's and the spike detector's two forms
    (``ZeitgeistConfig(columnar_model=False)``, ``columnar_detector=False``: the per-record
    ones) on the same sample: the same window models and anomalies, ids and wall times
    included, the same counters, and the same evaluation against the generator's ground truth."""
    generate(tmp_path / "data", GEN)
    runs = [
        _run(tmp_path / "data", dataclasses.replace(CFG, **{flag: columnar}))
        for columnar in (False, True)
    ]
    assert [type(h._runners[computation].computation).__name__ for h in runs] == classes
    for stream in ("window_models", "anomalies"):
        assert _multiset(runs[1].output(stream)) == _multiset(runs[0].output(stream)), stream
    kinds = Counter(a["kind"] for a in runs[0].values("anomalies"))
    assert kinds["spike"] >= 2 and kinds["dip"] >= 2, kinds
    a, b = (h.metrics(computation) for h in runs)
    for name in COUNTERS:
        assert a[name] == b[name], name
    truth = load_truth(tmp_path / "data")
    scores = [
        evaluate(
            RunResult(
                [dict(a) for a in h.values("anomalies")],
                {n: dict(h.metrics(n)) for n in h.topology.computations},
                [],
                wall_clock=False,
            ),
            truth,
        )["by_kind"]
        for h in runs
    ]
    assert scores[0] == scores[1] and scores[1]["spike"]["recall"] == 1.0
