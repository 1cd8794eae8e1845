"""The per-key step against a plain reference model (hypothesis), through the harness.

The model is the obvious batch computation: keep the first delivery of each record id,
drop records that arrive behind the injector low watermark, sum values per (key, 1 s
window), emit each window once. The harness must agree whatever the interleaving of
deliveries, duplicates, watermark advances and processing rounds, and must never emit a
window before the low watermark has passed its end (§4.5, §4.6, §6.1.1).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from millwheel import Computation, ComputationOptions, Record, Topology
from millwheel.testing import Crash, Harness


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


@given(pool, ops)
def test_harness_matches_the_reference_model(records, operations):
    h = Harness.for_computation(WindowSum, inputs=["in"], outputs=["sums"])
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
    assert all(h.timers("WindowSum", k) == [] for k in "abc")
    assert all(h.state("WindowSum", k) is None for k in "abc")


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


@given(pool, crash_ops, st.booleans())
def test_crashes_anywhere_change_nothing_downstream(records, operations, strong):
    """Crash the first stage at any point (§6.1): the second stage sees each window exactly once."""
    t = Topology("crashy")
    t.injector("in")
    t.computation(
        WindowSum,
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
            h.process("WindowSum", crash=arg)
            h.restart("WindowSum")
        else:
            h.run()
    h.finish("in")
    h.run()
    got = h.state("Collect", "all") or []
    assert Counter((k, s) for k, s, _ in got) == Counter(ref.expected.keys()), (
        "a window was lost or duplicated"
    )
    assert {(k, s): v for k, s, v in got} == dict(ref.expected)
