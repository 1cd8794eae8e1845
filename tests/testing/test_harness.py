"""The harness itself, and the Zeitgeist-style WindowCounter -> DipDetector of MillWheel Fig. 9."""

from __future__ import annotations

import pytest

from computations.windowing import WindowCounter
from millwheel import (
    Computation,
    ComputationOptions,
    ErrorPolicy,
    HarnessError,
    LatePolicy,
    Record,
    SampleSource,
    Stage,
    Topology,
)
from millwheel.testing import Harness, RunResult


class DipDetector(Computation):
    """MillWheel Fig. 9's ``DipDetector::ProcessRecord``, literally.

    The prediction is the key's moving average of earlier complete windows (the shipped
    Zeitgeist detector in ``computations/anomalies.py`` uses ``ModelCalculator`` instead).
    """

    def __init__(self, warmup_windows: int, confidence_threshold: int, dip_ratio: float) -> None:
        self.warmup, self.threshold, self.ratio = warmup_windows, confidence_threshold, dip_ratio

    def process_record(self, record):
        s = self.state.get({"sum": 0, "n": 0, "confidence": 0})
        actual = record.value["count"]  # GetBucketCount(input.data())
        prediction = s["sum"] / s["n"] if s["n"] else None  # state.GetPrediction(...)
        if prediction is not None and s["n"] >= self.warmup and actual < self.ratio * prediction:
            s["confidence"] += 1  # state.UpdateConfidence(prediction, actual)
        else:
            s["confidence"] = 0
            s["sum"], s["n"] = s["sum"] + actual, s["n"] + 1
        if s["confidence"] >= self.threshold:  # state.confidence() > kConfidenceThreshold
            dip = {
                "key": self.key,
                "window_start": record.value["window_start"],
                "actual": actual,
                "predicted": prediction,
                "confidence": s["confidence"],
            }
            self.produce("dips", dip, timestamp=record.timestamp)
        self.state.set(s)


def fig9(late: LatePolicy) -> Harness:
    t = Topology("fig9")
    t.injector("queries")
    t.computation(
        WindowCounter,
        inputs={"queries": lambda r: r.value["query"]},
        outputs=["window_counts"],
        options=ComputationOptions(late=late),
        params={"trailing_empty": 3},
    )
    t.computation(
        DipDetector,
        inputs={"window_counts": lambda r: r.value["key"]},
        outputs=["dips"],
        params={"warmup_windows": 3, "confidence_threshold": 2, "dip_ratio": 0.5},
    )
    return Harness(t)


def traffic(h: Harness, per_second: dict[int, int], query: str = "cats") -> list[Record]:
    return [
        h.record({"query": query}, s * 1_000 + (i * 37) % 1_000)
        for s, n in per_second.items()
        for i in range(n)
    ]


def test_windows_and_dips_end_to_end_with_a_late_record():
    h = fig9(LatePolicy.to_stream("late_queries"))
    normal = {s: 10 for s in range(0, 6)}
    h.inject("queries", traffic(h, normal))
    h.advance_watermark("queries", 6_000)
    h.run()
    counts = [(v["window_start"], v["count"]) for v in h.values("window_counts")]
    assert counts == [(s * 1_000, 10) for s in range(6)]
    assert h.values("dips") == []

    # a late record for the already-closed window 2000-3000 goes to the late stream
    h.inject("queries", [h.record({"query": "cats"}, 2_500, id="straggler")])
    # then traffic collapses for two seconds and comes back
    h.inject("queries", traffic(h, {6: 2, 7: 1, 8: 10, 9: 10}))
    h.advance_watermark("queries", 8_000)
    result = h.run()
    assert [v["count"] for v in result.values("window_counts")] == [2, 1]
    (dip,) = result.values("dips")
    assert (dip["key"], dip["window_start"], dip["actual"], dip["confidence"]) == (
        "cats",
        7_000,
        1,
        2,
    )
    assert dip["predicted"] == pytest.approx(10.0)
    (late,) = h.output("late_queries")
    assert late.id == "straggler"
    assert h.metrics("WindowCounter")["late_to_stream"] == 1
    # no window was produced twice, and the closed window was not reopened
    starts = [v["window_start"] for v in h.values("window_counts")]
    assert len(starts) == len(set(starts))

    h.finish("queries")
    result = h.run()
    assert [v["count"] for v in result.values("window_counts")] == [10, 10]
    assert result.values("dips") == [] and result.output("late_queries") == []
    assert h.timers("WindowCounter", "cats") == []


def test_late_record_dropped_and_counted_by_default_policy():
    h = fig9(LatePolicy.drop())
    h.inject("queries", traffic(h, {0: 3}))
    h.advance_watermark("queries", 1_000)
    h.run()
    h.inject("queries", [h.record({"query": "cats"}, 500)])
    h.finish("queries")
    h.run()
    assert [v["count"] for v in h.values("window_counts")] == [3]
    assert h.metrics("WindowCounter")["late_dropped"] == 1


def test_run_sources_feeds_injectors_batch_by_batch():
    recs = [
        Record(None, {"query": q}, ts, f"s{i}")
        for i, (q, ts) in enumerate([("a", 100), ("b", 1_200), ("a", 900), ("a", 2_100)])
    ]
    t = Topology("src")
    t.injector("queries", SampleSource(recs, batch_size=2))
    t.computation(
        WindowCounter,
        inputs={"queries": lambda r: r.value["query"]},
        outputs=["window_counts"],
        params={"trailing_empty": 0},
    )
    h = Harness(t)
    result = h.run_sources()
    assert result.values("window_counts") == h.values("window_counts")
    assert [r.id for r in result.output("queries")] == ["s0", "s1", "s2", "s3"]
    got = sorted((v["key"], v["window_start"], v["count"]) for v in h.values("window_counts"))
    assert got == [("a", 0, 2), ("a", 2_000, 1), ("b", 1_000, 1)]
    assert h.metrics("WindowCounter")["late"] == 0  # out-of-order within the source is not late


def test_is_deterministic():
    def once():
        h = fig9(LatePolicy.drop())
        h.inject(
            "queries", traffic(h, {0: 5, 1: 7, 2: 1, 3: 0, 4: 9}) + traffic(h, {1: 3}, query="dogs")
        )
        h.finish("queries")
        h.run()
        return h.output("window_counts"), h.output("dips")

    assert once() == once()


def test_helpful_errors():
    h = fig9(LatePolicy.drop())
    with pytest.raises(
        HarnessError, match=r"no injector or injected stream named 'querys' \(injectors: queries\)"
    ):
        h.inject("querys", [])
    with pytest.raises(HarnessError, match="takes Record objects"):
        h.inject("queries", [{"query": "cats"}])
    with pytest.raises(HarnessError, match="no computation named 'Nope'"):
        h.state("Nope", "k")
    with pytest.raises(HarnessError, match="exactly one of"):
        h.advance_wall_time()


def test_the_timer_and_hold_index_agrees_with_a_plain_scan():
    """The harness finds due timers and the oldest hold through an index (a round costs
    what is due, not every key): checked against a scan over random updates."""
    import random

    from millwheel.testing._index import MinIndex

    rng = random.Random(7)
    ix, model = MinIndex(), {}
    for _ in range(5_000):
        key = rng.choice(["a", 1, ("t", 2), "b", 3.5, None] + [f"k{i}" for i in range(40)])
        value = rng.choice([None, rng.randrange(-50, 50)])
        ix.put(key, value)
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
        bound = rng.randrange(-60, 60)
        assert ix.min() == min(model.values(), default=None)
        assert ix.at_most(bound) == {k for k, v in model.items() if v <= bound}


def test_set_state_seeds_a_key_and_dedup_ids_and_teardown_are_public():
    events = []

    class Counter(Computation):
        def setup(self) -> None:
            events.append("setup")

        def teardown(self) -> None:
            events.append("teardown")

        def process_record(self, record: Record) -> None:
            self.state.set(self.state.get(0) + 1)
            self.produce("counts", self.state.get())

    with Harness.for_computation(
        Counter, inputs={"in": lambda r: r.value}, outputs=["counts"]
    ) as h:
        h.set_state("Counter", "cats", 41)  # the test's given, as Spark's TwsTester.setValueState
        assert h.state("Counter", "cats") == 41 and h.keys("Counter") == ["cats"]
        h.inject("in", [h.record("cats", 1_000, id="c1")])
        h.run()
        assert h.values("counts") == [42]
        assert h.dedup_ids("Counter", "cats") == {"c1"}
        h.set_state("Counter", "cats", None)
        assert h.state("Counter", "cats") is None and h.dedup_ids("Counter", "cats") == {
            "c1"
        }  # ids kept
        with pytest.warns(DeprecationWarning, match="internal type"):
            h.envelope("Counter", "cats")
        h.restart("Counter")  # the old instance is torn down, a new one set up
        assert events == ["setup", "teardown", "setup"]
    assert events == ["setup", "teardown", "setup", "teardown"]
    assert h.metrics("Counter")["processed"] == 1  # results stay readable
    with pytest.raises(HarnessError, match="the harness is closed"):
        h.process("Counter")
    with pytest.raises(
        HarnessError, match="keys must be str, int, bytes or a tuple of those; got list"
    ):
        h.set_state("Counter", [1], 1)


class Picky(Computation):
    """Echoes values; a value "boom" fails (dead-lettered under ErrorPolicy.DEAD_LETTER)."""

    def process_record(self, record):
        if record.value == "boom":
            msg = "boom"
            raise ValueError(msg)
        self.produce("echoes", record.value)


def test_run_returns_what_was_published_since_the_previous_run():
    h = Harness.for_computation(
        Picky,
        inputs={"words": lambda r: r.value},
        outputs=["echoes"],
        options=ComputationOptions(on_error=ErrorPolicy.DEAD_LETTER),
        raise_errors=False,
    )
    assert h.run() == RunResult({}) and h.run().streams() == []
    h.inject("words", [h.record("a", 1_000), h.record("b", 1_100)])
    first = h.run()
    assert first.values("echoes") == ["a", "b"]
    assert first.values("words") == ["a", "b"]  # what inject published before the run
    assert first.dead_letters() == [] and first.values("no_such_stream") == []
    assert repr(first) == "RunResult(echoes=2, words=2)"

    h.inject("words", [h.record("boom", 1_200), h.record("c", 1_300)])
    h.inject("words", [Record(None, "x", 1_400, "")])  # refused at the injector: a dead letter
    second = h.run()
    assert second.values("echoes") == ["c"]
    stages = sorted(d.value.stage for d in second.dead_letters())
    assert stages == [Stage.INVALID_RECORD, Stage.PROCESS_RECORD]
    assert second.dead_letters() == h.dead_letters()
    assert h.values("echoes") == ["a", "b", "c"]  # the harness keeps every run's
    assert h.run().streams() == []  # nothing new


def test_a_run_result_reads_what_a_manual_round_published_before_it():
    h = Harness.for_computation(Picky, inputs={"words": lambda r: r.value}, outputs=["echoes"])
    h.inject("words", [h.record("a", 1_000)])
    h.process("Picky", deliver=False)  # strong productions checkpointed, not sent
    h.restart("Picky")
    result = h.run()
    assert result.values("echoes") == ["a"]
    assert [r.id for r in result.output("echoes")] == [r.id for r in h.output("echoes")]
