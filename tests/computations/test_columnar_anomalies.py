"""``ColumnarSpikeDetector`` and ``ColumnarDipDetector`` (``computations/columnar_anomalies.py``)
against the per-record detectors: the same productions (values, timestamps, ids), state,
counters and dead letters in the harness, over random streams (property tests: a fresh
hypothesis seed each run, printed with any failure); and both against a plain answer on
in-order data."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from computations.anomalies import DipDetector, SpikeDetector, Thresholds
from computations.columnar_anomalies import ColumnarDipDetector, ColumnarSpikeDetector
from computations.model import expected_count, new_model
from millwheel import DEAD_LETTER_STREAM, ComputationOptions, LatePolicy, Record
from millwheel.testing import Harness

INPUTS = {"queries": lambda r: r.value["query"], "window_models": lambda r: r.value["key"]}
W = 1_000


def _model(level: float) -> dict[str, Any]:
    m = new_model(60_000, 3_000)
    m.update(level=level, windows=50)
    return m


def scenario(seed: int) -> tuple[list[tuple[str, list[Record], int | None]], dict[str, Any], str]:
    """Rounds of ``(stream, records, watermark or None)`` shaped like Zeitgeist's two inputs:
    per query a base rate with bursts, model updates arriving before, among and after the
    events they predict (some with no model yet, one malformed), events out of order within
    and across rounds, duplicates sent again later, a few far behind; and the detector's
    parameters (small horizons, so buckets are collected and unjudged ones dropped)."""
    rng = random.Random(seed)
    keys = [f"q{i}" for i in range(rng.randrange(1, 5))] + (
        [("q", 9)] if rng.random() < 0.3 else []
    )
    buckets = rng.randrange(8, 40)
    raw: list[Record] = []
    models: list[Record] = []
    n = 0
    for k in keys:
        rate = rng.randrange(2, 12)
        burst = 0
        for b in range(buckets):
            if not burst and rng.random() < 0.12:
                burst = rng.randrange(1, 5)  # a spike lasting a few buckets
            count = rate * (rng.choice((4, 6)) if burst else 1)
            burst = max(0, burst - 1)
            if rng.random() < 0.05:
                count = 0
            for _ in range(count):
                n += 1
                ts = b * W + rng.randrange(W)
                raw.append(Record(None, {"query": k, "id": f"e{n}", "ts": ts}, ts, f"e{n}"))
            if rng.random() < 0.3:
                n += 1
                level = rate * rng.uniform(0.6, 1.4)
                value: dict[str, Any] = {"key": k, "window_start": b * W, "count": count}
                r = rng.random()
                value["model"] = None if r < 0.15 else ("garbage" if r < 0.18 else _model(level))
                models.append(Record(None, value, (b + 1) * W + rng.randrange(3 * W), f"m{n}"))
    # a raw event's value that names a window start of None is still a raw event
    if raw and rng.random() < 0.3:
        r0 = raw[0]
        raw[0] = Record(None, {**r0.value, "window_start": None}, r0.timestamp, r0.id)
    raw.sort(key=lambda r: r.timestamp + rng.randrange(-2 * W, 2 * W))
    models.sort(key=lambda r: r.timestamp + rng.randrange(-3 * W, 3 * W))
    rounds: list[tuple[str, list[Record], int | None]] = []
    sent: dict[str, list[Record]] = {"queries": [], "window_models": []}
    i = j = 0
    wm = 0
    while i < len(raw) or j < len(models):
        if j < len(models) and (i >= len(raw) or rng.random() < 0.35):
            stream, take = "window_models", models[j : j + rng.randrange(1, 6)]
            j += len(take)
        else:
            stream, take = "queries", raw[i : i + rng.randrange(1, 60)]
            i += len(take)
        batch = list(take)
        if sent[stream] and rng.random() < 0.3:  # sent again: duplicates
            batch += rng.sample(sent[stream], min(3, len(sent[stream])))
        sent[stream] += take
        rng.shuffle(batch)
        advance = None
        if rng.random() < 0.25 and batch:
            wm = max(wm, min(r.timestamp for r in batch) - rng.randrange(0, 3 * W))
            advance = wm
        rounds.append((stream, batch, advance))
    params = {
        "thresholds": Thresholds(
            spike_min_count=rng.choice((3, 10)), confidence_threshold=rng.choice((0, 1, 2))
        ),
        "keep_windows": rng.choice((3, 8, 30)),
        "max_unjudged": rng.choice((4, 50, 3_600)),
    }
    return rounds, params, rng.choice(("drop", "process"))


def run(cls: type, seed: int) -> Harness:
    rounds, params, late = scenario(seed)
    h = Harness.for_computation(
        cls,
        name="SpikeDetector",
        inputs=INPUTS,
        outputs=["anomalies"],
        params=params,
        options=ComputationOptions(
            late=LatePolicy.process() if late == "process" else LatePolicy.drop()
        ),
        raise_errors=False,
    )
    for stream, batch, wm in rounds:
        h.inject(stream, batch)
        if wm is not None:
            for injector in INPUTS:
                h.advance_watermark(injector, wm)
        h.advance_wall_time(by=137)
        h.run()
    return h


@given(st.integers(0, 2**32 - 1))
def test_the_columnar_detector_gives_the_per_record_productions_state_and_dead_letters(
    forms_agree, seed
):
    keys = {r.value["query"] for _, b, _ in scenario(seed)[0] for r in b if "query" in r.value}
    forms_agree(
        run(SpikeDetector, seed),
        run(ColumnarSpikeDetector, seed),
        "SpikeDetector",
        "anomalies",
        keys,
        ("records_in", "duplicates", "late", "late_dropped", "productions", "dead_letters"),
    )


def test_the_scenarios_exercise_spikes_dead_letters_and_collection():
    """The property test above means something only if its streams make anomalies, dead
    letters (a malformed model) and collected buckets: over a fixed spread of seeds, they do."""
    fired = dead = collected = 0
    for seed in range(40):
        h = run(SpikeDetector, seed)
        fired += len(h.output("anomalies"))
        dead += len(h.output(DEAD_LETTER_STREAM))
        _, params, _ = scenario(seed)
        collected += params["keep_windows"] == 3 and bool(h.output("anomalies"))
    assert fired > 50 and dead > 0 and collected > 0


@pytest.mark.parametrize("cls", [SpikeDetector, ColumnarSpikeDetector])
@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1))
def test_in_order_traffic_fires_what_a_plain_count_says(cls, seed):
    """A model first, then each query's events in time order, a bucket a round: a bucket is
    reported iff it and the ``confidence_threshold`` buckets before it all end above the
    threshold, and its ``actual`` is the first count past the threshold (it fires as that
    event arrives) — a plain count over the whole input, no detector involved."""
    rng = random.Random(seed)
    th = Thresholds(confidence_threshold=rng.choice((0, 1, 2)))
    level = {f"q{i}": rng.randrange(4, 20) for i in range(3)}
    counts = {
        k: [lv * (5 if rng.random() < 0.2 else 1) for _ in range(30)] for k, lv in level.items()
    }
    h = Harness.for_computation(
        cls, name="SpikeDetector", inputs=INPUTS, outputs=["anomalies"], params={"thresholds": th}
    )
    models = {k: _model(lv) for k, lv in level.items()}
    h.inject(
        "window_models",
        [h.record({"key": k, "window_start": 0, "model": m}, 0) for k, m in models.items()],
    )
    h.run()
    for b in range(30):
        h.inject(
            "queries",
            [
                h.record({"query": k}, b * W + i * (W // (c[b] + 1)))
                for k, c in counts.items()
                for i in range(c[b])
            ],
        )
        h.run()
    expected = set()
    for k, c in counts.items():
        limit = [th.spike_threshold(expected_count(models[k], b * W)) for b in range(30)]
        over = [c[b] > limit[b] for b in range(30)]
        for b in range(30):
            run_ = b >= th.confidence_threshold and all(
                over[b - i] for i in range(th.confidence_threshold + 1)
            )
            if run_:
                expected.add((k, b * W, math.floor(limit[b]) + 1))
    got = {(a["query"], a["window_start"], a["actual"]) for a in h.values("anomalies")}
    assert got == expected
    assert any(a["kind"] == "spike" for a in h.values("anomalies")) == bool(expected)


def test_state_rows_are_the_per_record_watch_pickled_and_nothing_for_a_key_without_events():
    """A key that only ever saw model updates with no model keeps no state in either form."""
    for cls in (SpikeDetector, ColumnarSpikeDetector):
        h = Harness.for_computation(cls, name="SpikeDetector", inputs=INPUTS, outputs=["anomalies"])
        h.inject("window_models", [h.record({"key": "cats", "window_start": 0, "model": None}, 1)])
        h.run()
        assert h.state("SpikeDetector", "cats") is None


# ---- the dip detector ------------------------------------------------------------------------
def dip_scenario(seed: int) -> tuple[list[tuple[list[Record], int | None]], dict[str, Any]]:
    """Rounds of ``window_models`` records: per query a window a bucket with the model's
    expectation (none while it warms up), runs of dips, buckets missing, windows out of order
    and sent again, one malformed (no count); the watermark moved now and then, to the end."""
    rng = random.Random(seed)
    recs: list[Record] = []
    for k in [f"q{i}" for i in range(rng.randrange(1, 5))]:
        expected = rng.uniform(10, 40)
        dip = 0
        for b in range(rng.randrange(5, 50)):
            if rng.random() < 0.08:
                continue  # no window for this bucket: a gap breaks a run
            if not dip and rng.random() < 0.15:
                dip = rng.randrange(1, 5)
            count = rng.randrange(0, 3) if dip else int(expected) + rng.randrange(-3, 4)
            dip = max(0, dip - 1)
            value: dict[str, Any] = {
                "key": k,
                "window_start": b * W,
                "count": count,
                "expected": None if b < 3 else expected,
            }
            if rng.random() < 0.01:
                del value["count"]
            recs.append(Record(None, value, (b + 1) * W, f"{k}-{b}"))
    recs.sort(key=lambda r: r.timestamp + rng.randrange(-3 * W, 3 * W))
    rounds: list[tuple[list[Record], int | None]] = []
    i, wm, sent = 0, 0, []
    while i < len(recs):
        take = recs[i : i + rng.randrange(1, 30)]
        i += len(take)
        batch = take + (rng.sample(sent, min(2, len(sent))) if sent and rng.random() < 0.3 else [])
        sent += take
        rng.shuffle(batch)
        advance = None
        if rng.random() < 0.4:
            wm = max(wm, min(r.timestamp for r in batch) + rng.randrange(-2 * W, 2 * W))
            advance = wm
        rounds.append((batch, advance))
    rounds.append(([], 10**9))
    return rounds, {"thresholds": Thresholds(confidence_threshold=rng.choice((0, 1, 2)))}


def dip_run(cls: type, seed: int) -> Harness:
    rounds, params = dip_scenario(seed)
    h = Harness.for_computation(
        cls,
        name="DipDetector",
        inputs={"window_models": lambda r: r.value["key"]},
        outputs=["anomalies"],
        params=params,
        raise_errors=False,
    )
    for batch, wm in rounds:
        h.inject("window_models", batch)
        if wm is not None:
            h.advance_watermark("window_models", wm)
        h.advance_wall_time(by=91)
        h.run()
    return h


@given(st.integers(0, 2**32 - 1))
def test_the_columnar_dip_detector_gives_the_per_record_productions_state_and_dead_letters(
    forms_agree, seed
):
    forms_agree(
        dip_run(DipDetector, seed),
        dip_run(ColumnarDipDetector, seed),
        "DipDetector",
        "anomalies",
        [f"q{i}" for i in range(4)],
        ("records_in", "duplicates", "timers_fired", "productions", "dead_letters"),
    )


def test_the_dip_scenarios_exercise_dips_and_dead_letters():
    """Over a fixed spread of seeds, the dip streams make dips and dead letters."""
    dips = dead = 0
    for seed in range(30):
        h = dip_run(DipDetector, seed)
        dips += len(h.output("anomalies"))
        dead += len(h.output(DEAD_LETTER_STREAM))
    assert dips > 30 and dead > 0
