"""Both kinds of computation against one plain reference model (hypothesis), through the harness.

The model is the obvious batch computation: keep the first delivery of each record id,
drop records that arrive behind the injector low watermark, sum values per (key, 1 s
window), emit each window once. The harness must agree whatever the interleaving of
deliveries, duplicates, re-deliveries, late records, watermark advances, processing
rounds and crashes with their replays, and must never emit a window before the low
watermark has passed its end (§4.5, §4.6, §6.1.1) — for the per-record computation (the
per-key step, ``millwheel/_step.py``) and for the same computation written as a columnar
one (the columnar runner, ``millwheel/_colrunner.py``): both run under one delivery
contract (``millwheel/_contract.py``), so one model answers for both.

Hypothesis draws fresh examples on every run and prints the falsifying operations (and
``@reproduce_failure``) when one fails. ``MILLWHEEL_MODEL_EXAMPLES=N`` runs ``N`` examples
per test instead of the profile's (``tests/conftest.py``: 60 in CI, 200 otherwise).
"""

from __future__ import annotations

import os
from collections import Counter

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import Computation, ComputationOptions, Record, Topology
from millwheel._columnar import ColumnarComputation
from millwheel.testing import Crash, Harness

#: more examples on request (a long run); the profile's count otherwise
_EXAMPLES = os.environ.get("MILLWHEEL_MODEL_EXAMPLES")
examples = settings(print_blob=True, **({"max_examples": int(_EXAMPLES)} if _EXAMPLES else {}))


class WindowSum(Computation):
    def process_record(self, record):
        start = record.timestamp // 1_000 * 1_000
        sums = self.state.get({})
        sums[start] = sums.get(start, 0) + record.value
        self.state.set(sums)
        self.set_timer(str(start), start + 1_000)

    def process_timer(self, timer):
        sums = self.state.get()
        start = timer.timestamp - 1_000
        self.produce("sums", (self.key, start, sums.pop(start)), timestamp=timer.timestamp)
        if sums:
            self.state.set(sums)
        else:
            self.state.clear()


class ColumnarWindowSum(ColumnarComputation):
    """:class:`WindowSum` as a columnar computation: the same state, timers and productions."""

    record_columns = ("key", "timestamp", "value")

    def process_batch(self, batch):
        r = batch.records
        start = r["timestamp"].to_numpy() // 1_000 * 1_000
        new = pd.DataFrame(
            {"key": r["key"].tolist(), "start": start, "sum": r["value"].astype("int64")}
        )
        old = batch.state
        rows = pd.concat([old.astype({"key": object}), new]) if len(old) else new
        sums = rows.groupby(["key", "start"], sort=False, as_index=False)["sum"].sum()
        batch.set_state(sums)
        fresh = new.drop_duplicates(["key", "start"])
        batch.set_timers(
            fresh["key"], [str(s) for s in fresh["start"].tolist()], fresh["start"] + 1_000
        )

    def process_timers(self, batch, timers):
        s = batch.state
        sums = dict(
            zip(
                zip(s["key"].tolist(), s["start"].tolist(), strict=True),
                s["sum"].tolist(),
                strict=True,
            )
        )
        keys, stamps = timers["key"].tolist(), timers["timestamp"].tolist()
        values = [
            (k, t - 1_000, sums.pop((k, t - 1_000))) for k, t in zip(keys, stamps, strict=True)
        ]
        batch.produce("sums", values, keys=keys, timestamps=stamps)
        left = list(sums.items())
        batch.set_state(
            pd.DataFrame(
                {
                    "key": [k for (k, _), _ in left],
                    "start": pd.array([s for (_, s), _ in left], dtype="int64"),
                    "sum": pd.array([v for _, v in left], dtype="int64"),
                }
            )
        )


KINDS = pytest.mark.parametrize(
    "kind", [WindowSum, ColumnarWindowSum], ids=["per_record", "columnar"]
)

pool = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 6_000), st.integers(1, 9)),
    min_size=1,
    max_size=25,
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("inject"), st.integers(0, 24)),
        st.tuples(st.just("watermark"), st.integers(0, 1_500)),
        st.tuples(st.just("run"), st.just(0)),
    ),
    max_size=60,
)


class Reference:
    """The plain model, driven alongside a harness: the same deliveries and watermark moves."""

    def __init__(self, harness: Harness, records: list[tuple[str, int, int]]) -> None:
        self.h, self.records = harness, records
        self.watermark = 0
        self.seen: set[int] = set()
        self.expected: Counter = Counter()

    def inject(self, arg: int) -> None:
        i = arg % len(self.records)
        key, ts, value = self.records[i]
        self.h.inject("in", [Record(key, value, ts, f"id{i}")])
        if ts >= self.watermark and i not in self.seen:  # first delivery, not late
            self.seen.add(i)
            self.expected[(key, ts // 1_000 * 1_000)] += value

    def advance(self, by: int) -> None:
        self.watermark += by
        self.h.advance_watermark("in", self.watermark)


@KINDS
@examples
@given(records=pool, operations=ops)
def test_harness_matches_the_reference_model(kind, records, operations):
    h = Harness.for_computation(kind, inputs=["in"], outputs=["sums"])
    ref = Reference(h, records)
    for op, arg in operations:
        if op == "inject":
            ref.inject(arg)
        elif op == "watermark":
            ref.advance(arg)
        else:
            h.run()
            for key, start, _ in h.values("sums"):
                assert start + 1_000 <= ref.watermark, (
                    f"window {key}@{start} emitted before the watermark passed it"
                )
    h.finish("in")
    h.run()
    got = Counter({(k, s): v for k, s, v in h.values("sums")})
    assert len(h.values("sums")) == len(got), "a window was emitted twice"
    assert got == ref.expected
    name = kind.__name__
    assert all(h.timers(name, k) == [] for k in "abc")
    assert all(_no_state(h.state(name, k)) for k in "abc")


def _no_state(state) -> bool:
    """A key keeps no state: ``None``, or (a columnar computation) no state rows."""
    return state is None or (isinstance(state, pd.DataFrame) and len(state) == 0)


class Collect(Computation):
    def process_record(self, record):
        self.state.set([*self.state.get([]), record.value])


crash_ops = st.lists(
    st.one_of(
        st.tuples(st.just("inject"), st.integers(0, 24)),
        st.tuples(st.just("watermark"), st.integers(0, 1_500)),
        st.tuples(st.just("crash"), st.sampled_from(list(Crash))),
        st.tuples(st.just("run"), st.just(None)),
    ),
    max_size=60,
)


@KINDS
@examples
@given(records=pool, operations=crash_ops, strong=st.booleans())
def test_crashes_anywhere_change_nothing_downstream(kind, records, operations, strong):
    """Crash the first stage at any point (§6.1): the second stage sees each window exactly once."""
    t = Topology("crashy")
    t.injector("in")
    t.computation(
        kind,
        inputs=["in"],
        outputs=["sums"],
        options=ComputationOptions(strong_productions=strong),
    )
    t.computation(Collect, inputs={"sums": lambda r: "all"})
    h = Harness(t)
    ref = Reference(h, records)
    for op, arg in operations:
        if op == "inject":
            ref.inject(arg)
        elif op == "watermark":
            ref.advance(arg)
        elif op == "crash":
            h.process(kind.__name__, crash=arg)
            h.restart(kind.__name__)
        else:
            h.run()
    h.finish("in")
    h.run()
    got = h.state("Collect", "all") or []
    assert Counter((k, s) for k, s, _ in got) == Counter(ref.expected.keys()), (
        "a window was lost or duplicated"
    )
    assert {(k, s): v for k, s, v in got} == dict(ref.expected)
