"""One delivery contract, two kinds of computation (``millwheel/_contract.py``).

A per-record computation run by the per-key step (``_step.py`` through ``_delivery.run_key``)
and the same computation written as a columnar one, run by the columnar runner
(``_colrunner.py``), get the same random batches: new records, duplicates, re-deliveries of
records sent batches ago, late records (behind the watermark they arrive under), records of
one batch under several arrival watermarks (timers falling due between them), watermark
moves that fire timers (all that are due, or a few per key and step), and records whose user
code raises. Whatever the late policy and with or without exactly-once, they must agree: each key's productions (ids, values,
timestamps, in order), the dead letters (ids and reasons), and every counter the contract
defines (not the dedup indexes' own: Bloom answers and collections differ by design).

Hypothesis draws fresh examples on every run and prints the falsifying batches when one
fails; ``MILLWHEEL_MODEL_EXAMPLES=N`` runs ``N`` examples (``tests/test_step_model.py``).
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import Computation, ComputationOptions, LatePolicy, Record, TimeDomain
from millwheel._colinput import InputColumns
from millwheel._colrunner import ColumnarRunner
from millwheel._columnar import ColumnarComputation
from millwheel._contract import (
    dedup_horizon,
    late_watermark,
    late_watermarks,
    timer_order,
    timers_order,
    within_budget,
)
from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import run_key
from millwheel._identity import batch_life
from millwheel._record import MIN_TIMESTAMP, encode_key
from millwheel._step import StepRunner

_EXAMPLES = os.environ.get("MILLWHEEL_MODEL_EXAMPLES")
examples = settings(
    print_blob=True, deadline=None, **({"max_examples": int(_EXAMPLES)} if _EXAMPLES else {})
)

#: the counters both kinds must agree on (the dedup indexes' own differ by design)
COMPARED = (
    "records_in",
    "duplicates",
    "late",
    "late_dropped",
    "late_to_stream",
    "processed",
    "timers_fired",
    "timers_deferred",
    "productions",
    "productions_behind_watermark",
    "dead_letters",
    "dead_letters_dropped",
)
UNLUCKY = 13
#: wall time in the differential test (wall-time timers at or before it fire in every step)
NOW = 10
WALL = TimeDomain.WALL_TIME


class Tally(Computation):
    """Counts each key's records; produces one row per record and per timer; 13 fails."""

    def process_record(self, record):
        if record.value == UNLUCKY:
            msg = "unlucky"
            raise ValueError(msg)
        n = self.state.get(0) + 1
        self.state.set(n)
        # the low watermark a call sees is part of the contract (a key's run before its next one
        # sees that run's arrival watermark, its last run the batch's: ``_delivery.plan_steps``)
        self.produce(
            "out", [self.key, record.value, n, self.low_watermark], timestamp=record.timestamp
        )
        self.set_timer(f"t{record.value % 3}", record.timestamp + 100)
        if record.value % 7 == 0:  # a wall-time timer: due at once unless 14 (``NOW``)
            self.set_timer("w", 1 + record.value, TimeDomain.WALL_TIME)

    def process_timer(self, timer):
        self.produce("out", [self.key, timer.tag, self.state.get(0)], timestamp=timer.timestamp)


class ColumnarTally(ColumnarComputation):
    """:class:`Tally` as a columnar computation."""

    record_columns = ("key", "timestamp", "value")

    def process_batch(self, batch):
        r = batch.records
        values = r["value"].tolist()
        if UNLUCKY in values:
            msg = "unlucky"
            raise ValueError(msg)
        s = batch.state
        count = dict(zip(s["key"].tolist(), s["n"].tolist(), strict=True)) if len(s) else {}
        keys, rows = r["key"].tolist(), []
        for k, v in zip(keys, values, strict=True):
            count[k] = count.get(k, 0) + 1
            rows.append([k, v, count[k], batch.low_watermark])
        ts = r["timestamp"].to_numpy()
        batch.produce("out", rows, keys=keys, timestamps=ts)
        batch.set_state(
            pd.DataFrame({"key": list(count), "n": pd.array(list(count.values()), dtype="int64")})
        )
        batch.set_timers(keys, [f"t{v % 3}" for v in values], ts + 100)
        wall = [(k, 1 + v) for k, v in zip(keys, values, strict=True) if v % 7 == 0]
        batch.set_timers([k for k, _ in wall], ["w"] * len(wall), [t for _, t in wall], WALL)

    def process_timers(self, batch, timers):
        s = batch.state
        count = dict(zip(s["key"].tolist(), s["n"].tolist(), strict=True)) if len(s) else {}
        keys = timers["key"].tolist()
        rows = [
            [k, tag, count.get(k, 0)] for k, tag in zip(keys, timers["tag"].tolist(), strict=True)
        ]
        batch.produce("out", rows, keys=keys, timestamps=timers["timestamp"].to_numpy())


POLICIES = {
    "drop": LatePolicy.drop(),
    "process": LatePolicy.process(),
    "to_stream": LatePolicy.to_stream("late"),
}

# a batch: records (key, time offset, value, a new id or a re-delivery of an earlier one,
# the watermark it arrived under: an offset behind the current one, or none given), then
# how far the watermark moves before the batch runs. Records of one batch arrive under one
# watermark or under several, in any order: a record 400 ms behind sets a timer that falls
# due before those 0 ms behind are processed (the per-key step fires it between the runs);
# a record 300 ms ahead arrived under a watermark the batch's has not reached yet (its
# heartbeat comes later), so its run and the ones after it see the batch's: one call
arrivals = st.one_of(
    st.just([None]),
    st.lists(st.integers(0, 500), min_size=1, max_size=1),
    st.lists(st.sampled_from([-300, 0, 150, 400]), min_size=2, max_size=3, unique=True),
)
batches = st.lists(
    st.tuples(
        st.lists(
            st.tuples(
                st.integers(0, 3),
                st.integers(-400, 600),
                st.integers(0, 20),
                st.one_of(st.none(), st.integers(0, 10**6)),
                st.integers(0, 2),
            ),
            max_size=12,
        ),
        arrivals,
        st.sampled_from([0, 0, 50, 150, 400, 2_000]),
        # where a record's own watermark is not known: the batch's (``None``), or the one
        # before the batch's move, as a runtime batch whose heartbeat raised it passes it
        st.sampled_from([None, "before"]),
    ),
    min_size=1,
    max_size=8,
)


class PerRecord:
    """The per-record side: envelopes per key, each batch through ``run_key`` per key."""

    def __init__(self, options: ComputationOptions) -> None:
        self.runner = StepRunner(Tally(), name="Tally", outputs=["out"], options=options)
        self.envs: dict[str, bytes | None] = {}
        self.metrics = StepMetrics()
        self.out: dict[str, list] = defaultdict(list)
        self.dead: list = []

    def batch(self, items, arrival, lw, life, unknown=None):
        by_key: dict[str, list] = {}
        for rec, a in zip(items, arrival, strict=True):
            by_key.setdefault(rec.key, []).append((rec, a))
        for key in [*by_key, *(k for k in self.envs if k not in by_key)]:
            got = run_key(
                self.runner,
                key,
                self.envs.get(key),
                by_key.get(key, []),
                low_watermark=lw,
                now=NOW,
                metrics=self.metrics,
                life=life,
                arrival=unknown,
            )
            self.envs[key] = got.envelope
            self.out[key] += [_row(p) for p in got.productions]
            self.dead += [_row(p) for p in got.dead_letters]


class Columnar:
    """The columnar side: one store for every key, each batch one run."""

    def __init__(self, options: ComputationOptions) -> None:
        self.runner = ColumnarRunner(
            ColumnarTally(), name="Tally", outputs=["out"], options=options
        )
        self.store = None
        self.metrics = StepMetrics()
        self.out: dict[str, list] = defaultdict(list)
        self.dead: list = []

    def batch(self, items, arrival, lw, life, unknown=None):
        recs = InputColumns(
            [encode_key(r.key) for r in items],
            [r.id for r in items],
            np.array([r.timestamp for r in items], np.int64),
            ["in"] * len(items),
            [r.value for r in items],
            arrival=arrival,
            encoded=False,
        )
        res = self.runner.run(
            self.store, recs, low_watermark=lw, now=NOW, life=life, arrival=unknown
        )
        self.store = res.store
        for name, n in res.metrics.items():
            setattr(self.metrics, name, getattr(self.metrics, name) + n)
        for p in res.productions():
            self.out[p.record.key] += [_row(p)]
        self.dead += [_row(p) for p in res.dead_letters]


def _row(p):
    r = p.record
    return (p.stream, r.id, r.value, r.timestamp)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly_once", "at_least_once"])
@examples
@given(plan=batches, budget=st.sampled_from([None, 1, 2]))
def test_the_columnar_runner_and_the_per_key_step_deliver_alike(policy, exactly_once, plan, budget):
    # ``budget``: max_timer_fires_per_step (``None``: the default), the rest deferred alike
    options = ComputationOptions(
        late=POLICIES[policy],
        exactly_once=exactly_once,
        strong_productions=False,
        **({} if budget is None else {"max_timer_fires_per_step": budget}),
    )
    a, b = PerRecord(options), Columnar(options)
    wm, sent = 1_000, []
    for i, (recs, behind, move, unknown_at) in enumerate(plan):
        unknown = wm if unknown_at == "before" else None
        wm += move
        items, arrival = [], []
        for k, dt, value, again, under in recs:
            back = behind[under % len(behind)]
            arrival.append(None if back is None else wm - back)
            if again is not None and sent:
                items.append(sent[again % len(sent)])  # a re-delivery: same id, key, time, value
                continue
            rec = Record(f"k{k}", value, wm + dt, f"r{len(sent)}", "in")
            sent.append(rec)
            items.append(rec)
        life = batch_life("contract", i)
        a.batch(items, arrival, wm, life, unknown)
        b.batch(items, arrival, wm, life, unknown)
    late = [("late",)] if policy == "to_stream" else []
    for key in sorted(set(a.out) | set(b.out)):
        # per stream: the late stream's records may come before a key's other productions
        for stream in ["out", *(s for (s,) in late)]:
            got_a = [r for r in a.out[key] if r[0] == stream]
            got_b = [r for r in b.out[key] if r[0] == stream]
            assert got_a == got_b, (
                f"key {key}, stream {stream}: per-record {got_a} != columnar {got_b}"
            )
    assert sorted(a.dead) == sorted(b.dead)
    assert all(r[0] == DEAD_LETTER_STREAM for r in a.dead)
    ca, cb = a.metrics.as_dict(), b.metrics.as_dict()
    assert {n: ca[n] for n in COMPARED} == {n: cb[n] for n in COMPARED}


def _columns(sent):
    """A batch's ``(record, arrival watermark)`` pairs as the columnar runner's input."""
    return InputColumns(
        [encode_key(r.key) for r, _ in sent],
        [r.id for r, _ in sent],
        np.array([r.timestamp for r, _ in sent]),
        [r.stream for r, _ in sent],
        [r.value for r, _ in sent],
        arrival=[w for _, w in sent],
        encoded=False,
    )


def test_records_of_one_batch_under_two_watermarks_fire_timers_between_them_on_both_paths():
    options = ComputationOptions(strong_productions=False)
    a, b = PerRecord(options), Columnar(options)
    life = batch_life("contract", 0)
    # key k under two watermarks, key j under the first only (its timers fire at the end)
    sent = [
        (Record("k", 3, 1_000, "a", "in"), 900),
        (Record("j", 4, 1_000, "c", "in"), 900),
        (Record("k", 6, 1_200, "b", "in"), 1_100),
    ]
    got = []
    for key in ("k", "j"):
        out = run_key(
            a.runner,
            key,
            None,
            [(r, w) for r, w in sent if r.key == key],
            low_watermark=2_000,
            now=0,
            metrics=a.metrics,
            life=life,
        )
        got += [_row(p) for p in out.productions]
    recs = _columns(sent)
    res = b.runner.run(None, recs, low_watermark=2_000, now=0, life=life)
    want = {key: [r for r in got if r[2][0] == key] for key in ("k", "j")}
    cols = {key: [_row(p) for p in res.productions() if p.record.key == key] for key in want}
    assert cols == want
    # the first run's timer t0 (at 1,100) fires before the second run sets it again (at 1,300)
    assert [r[2][1] for r in want["k"]] == [3, "t0", 6, "t0"]
    assert [r[2][1] for r in want["j"]] == [4, "t1"]
    ca = a.metrics.as_dict()
    assert {n: ca[n] for n in COMPARED} == {n: res.metrics[n] for n in COMPARED}


def test_runs_whose_calls_would_see_one_watermark_are_one_call_each_record_late_by_its_own():
    """Records under arrival watermarks at or past the batch's (their heartbeats come later):
    every run would see the batch's watermark, so they are one call — the timer the first
    record sets, due by the batch's watermark, fires once, after all of them — and a record
    is still late only against the watermark it arrived under (``_delivery.plan_steps``)."""
    options = ComputationOptions(strong_productions=False, late=LatePolicy.process())
    a, b = PerRecord(options), Columnar(options)
    life = batch_life("contract", 0)
    sent = [
        (Record("k", 1, 1_000, "a", "in"), 1_100),  # late against its own 1,100: still processed
        (Record("k", 2, 1_600, "b", "in"), 1_500),
        (Record("k", 3, 2_000, "c", "in"), 1_900),
    ]
    want = run_key(
        a.runner, "k", None, sent, low_watermark=1_200, now=0, metrics=a.metrics, life=life
    )
    recs = _columns(sent)
    res = b.runner.run(None, recs, low_watermark=1_200, now=0, life=life)
    rows = [_row(p) for p in want.productions]
    assert [_row(p) for p in res.productions()] == rows
    # the three records, each seeing the batch's watermark, then t1 (set at 1,100, due by 1,200)
    # with the count of all three (cut into runs, it fired after the first, with 1)
    assert [r[2][1:] for r in rows] == [[1, 1, 1_200], [2, 2, 1_200], [3, 3, 1_200], ["t1", 3]]
    assert a.metrics.late == res.metrics["late"] == 1


def test_a_key_that_keeps_nothing_between_two_arrival_watermarks_starts_a_new_life_on_both_paths(
    id_relays,
):
    echo, columnar_echo = id_relays
    options = ComputationOptions(exactly_once=False, strong_productions=False)
    per_key = StepRunner(echo(), name="Echo", outputs=["out"], options=options)
    columnar = ColumnarRunner(columnar_echo(), name="Echo", outputs=["out"], options=options)
    life = batch_life("contract", 0)
    sent = [(Record("k", v, 1_000 * v, f"r{v}", "in"), 100 * (7 + 2 * v)) for v in (1, 2)]
    got = run_key(
        per_key, "k", None, sent, low_watermark=2_000, now=0, metrics=StepMetrics(), life=life
    )
    recs = _columns(sent)
    res = columnar.run(None, recs, low_watermark=2_000, now=0, life=life)
    assert len(got.productions) == 2
    assert [_row(p) for p in res.productions()] == [_row(p) for p in got.productions]
    assert res.store is None  # the key keeps nothing after the batch either


# ---- the rules' scalar and vectorised forms agree ---------------------------------------------
@given(
    st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.integers(-50, 50))), max_size=20),
    st.integers(-50, 50),
)
def test_the_late_watermark_of_a_column_is_that_of_each_record(rows, lw):
    not_dead = np.array([not dead for dead, _ in rows], np.bool_)
    known = np.array([a is not None for _, a in rows], np.bool_)
    arrival = np.array([0 if a is None else a for _, a in rows], np.int64)
    got = late_watermarks(not_dead, arrival if known.any() else None, known, lw).tolist()
    want = [late_watermark(DEAD_LETTER_STREAM if dead else "s", a, lw) for dead, a in rows]
    assert got == want
    assert all(w == MIN_TIMESTAMP for w, (dead, _) in zip(got, rows, strict=True) if dead)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 1), st.sampled_from("abc")),
        max_size=30,
    ),
    st.integers(0, 4),
)
def test_timer_order_and_budget_over_columns_are_the_scalar_rules(timers, budget):
    key, ts, d, tag = (np.array(c) for c in zip(*timers, strict=True)) if timers else ([],) * 4
    tag_codes = np.array(["abc".index(t) for t in tag], np.int64)
    order = timers_order(np.asarray(key), np.asarray(ts), np.asarray(d), tag_codes).tolist()
    want = sorted(range(len(timers)), key=lambda i: (timers[i][0], timer_order(*timers[i][1:])))
    assert [timers[i] for i in order] == [timers[i] for i in want]
    fired_before = np.zeros(4, np.int64)
    go = within_budget(np.array([timers[i][0] for i in order], np.int64), fired_before, budget)
    per_key: dict[int, int] = defaultdict(int)
    for i, ok in zip(order, go.tolist(), strict=True):
        assert ok == (per_key[timers[i][0]] < budget)
        per_key[timers[i][0]] += 1


def test_the_dedup_horizon_is_the_older_watermark_less_the_slack():
    assert dedup_horizon(5_000, None, 100) == 4_900
    assert dedup_horizon(5_000, 3_000, 100) == 2_900
    assert dedup_horizon(5_000, 7_000, 0) == 5_000
