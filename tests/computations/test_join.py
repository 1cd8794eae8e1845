"""``WindowedJoin`` (computations/join.py): the bounded-delay join of the Adform write-up, against pandas,
in any arrival order, duplicated, on the harness and on local Spark."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from computations.columnar_join import ColumnarWindowedJoin
from computations.join import WindowedJoin
from millwheel import MAX_TIMESTAMP, ComputationError, Record, SampleSource, Topology
from millwheel.testing import Harness

INPUTS = {"views": lambda r: r.value["k"], "clicks": lambda r: r.value["k"]}


def _records(seed: int, n_left: int = 60, keys: int = 8) -> tuple[list[Record], list[Record]]:
    rng = random.Random(seed)
    lefts = [
        Record(
            None, {"k": f"k{rng.randrange(keys)}", "i": i}, 1_000 + rng.randrange(20_000), f"L{i}"
        )
        for i in range(n_left)
    ]
    rights = []
    for j in range(n_left):
        base = lefts[rng.randrange(n_left)]
        ts = base.timestamp + rng.randrange(-1_500, 3_000)
        rights.append(
            Record(
                None, {"k": base.value["k"] if rng.random() < 0.8 else "other", "j": j}, ts, f"R{j}"
            )
        )
    return lefts, rights


def _pandas(lefts, rights, before, after, how):
    L = pd.DataFrame([{"k": r.value["k"], "i": r.value["i"], "ts_l": r.timestamp} for r in lefts])
    R = pd.DataFrame([{"k": r.value["k"], "j": r.value["j"], "ts_r": r.timestamp} for r in rights])
    m = L.merge(R, on="k")
    m = m[(m["ts_r"] >= m["ts_l"] - before) & (m["ts_r"] <= m["ts_l"] + after)]
    out = {(k, i, j) for k, i, j in zip(m.k, m.i, m.j, strict=True)}
    if how in ("left", "outer"):
        out |= {(k, i, None) for k, i in zip(L.k, L.i, strict=True) if i not in set(m.i)}
    if how == "outer":
        out |= {(k, None, j) for k, j in zip(R.k, R.j, strict=True) if j not in set(m.j)}
    return out


def _got(values):
    return [
        (v["key"], v["left"] and v["left"]["i"], v["right"] and v["right"]["j"]) for v in values
    ]


def _run(cls, how: str, seed: int, before: int, after: int):
    lefts, rights = _records(seed)
    rng = random.Random(seed + 100)
    h = Harness.for_computation(
        cls,
        name="WindowedJoin",
        inputs=INPUTS,
        outputs=["joined"],
        params={"left": "views", "before_ms": before, "after_ms": after, "how": how},
    )
    everything = [("views", r) for r in lefts] + [("clicks", r) for r in rights]
    everything += rng.sample(everything, 10)  # duplicate deliveries
    rng.shuffle(everything)
    # the watermark is the oldest timestamp still to be sent: nothing is late
    for n, (stream, rec) in enumerate(everything, 1):
        h.inject(stream, [rec])
        if n % 15 == 0:
            wm = (
                min(r.timestamp for _, r in everything[n:])
                if n < len(everything)
                else MAX_TIMESTAMP
            )
            h.advance_watermark("views", max(wm, h.low_watermark("views")))
            h.advance_watermark("clicks", max(wm, h.low_watermark("clicks")))
            h.run()
    h.finish("views")
    h.finish("clicks")
    h.run()
    return h, lefts, rights


@pytest.mark.parametrize("cls", [WindowedJoin, ColumnarWindowedJoin])
@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_equals_pandas_whatever_the_arrival_order_and_duplicates(cls, how, seed):
    before, after = 1_000, 2_000
    h, lefts, rights = _run(cls, how, seed, before, after)
    got = _got(h.values("joined"))
    assert len(got) == len(set(got))  # nothing twice
    assert set(got) == _pandas(lefts, rights, before, after, how)
    assert h.metrics("WindowedJoin")["duplicates"] == 10 and h.metrics("WindowedJoin")["late"] == 0
    for key in h.keys(
        "WindowedJoin"
    ):  # nothing left in state once everything is closed (dedup ids may stay)
        assert h.state("WindowedJoin", key) is None and h.timers("WindowedJoin", key) == []


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_the_columnar_join_makes_the_per_record_joins_productions(how):
    """The same records, timestamps and ids (per key, the same order), the same holds at work."""
    a, _, _ = _run(WindowedJoin, how, 4, 500, 1_500)
    b, _, _ = _run(ColumnarWindowedJoin, how, 4, 500, 1_500)
    expected = sorted((r.id, r.timestamp, repr(r.value)) for r in a.output("joined"))
    assert (
        len(expected) > 30
        and sorted((r.id, r.timestamp, repr(r.value)) for r in b.output("joined")) == expected
    )
    for name in (
        "records_in",
        "duplicates",
        "processed",
        "productions",
        "productions_behind_watermark",
    ):
        assert a.metrics("WindowedJoin")[name] == b.metrics("WindowedJoin")[name], name


@pytest.mark.parametrize("cls", [WindowedJoin, ColumnarWindowedJoin])
def test_results_wait_for_the_window_to_close_and_hold_the_watermark(cls):
    h = Harness.for_computation(
        cls,
        name="WindowedJoin",
        inputs=INPUTS,
        outputs=["joined"],
        params={"left": "views", "after_ms": 1_000},
    )
    h.inject("views", [Record(None, {"k": "a", "i": 0}, 5_000, "L0")])
    h.inject("clicks", [Record(None, {"k": "a", "j": 0}, 5_500, "R0")])
    for wm in (5_999, 6_000):
        h.advance_watermark("views", wm)
        h.advance_watermark("clicks", wm)
        h.run()
        assert h.values("joined") == [] and h.low_watermark("WindowedJoin") <= 5_000
    h.advance_watermark("views", 6_001)
    h.advance_watermark("clicks", 6_001)
    h.run()
    assert _got(h.values("joined")) == [("a", 0, 0)]
    assert (
        h.output("joined")[0].timestamp == 5_000
    )  # the left record's time: the held output watermark allowed it


def test_bad_settings_are_refused():
    with pytest.raises(ComputationError, match="how must be one of"):
        WindowedJoin("views", how="full")
    with pytest.raises(ComputationError, match="must be >= 0"):
        WindowedJoin("views", before_ms=-1)


@pytest.mark.spark
@pytest.mark.parametrize("cls", [WindowedJoin, ColumnarWindowedJoin])
def test_spark_gives_the_harness_answer(tmp_path, cls):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    lefts, rights = _records(7, n_left=40)
    t = Topology("windowed_join")
    t.injector("views", SampleSource(sorted(lefts, key=lambda r: r.timestamp), batch_size=10))
    t.injector("clicks", SampleSource(sorted(rights, key=lambda r: r.timestamp), batch_size=10))
    t.computation(
        cls,
        name="WindowedJoin",
        inputs=INPUTS,
        outputs=["joined"],
        params={"left": "views", "before_ms": 1_000, "after_ms": 2_000, "how": "left"},
    )
    t.sink("joined")
    h = Harness(t)
    h.run_sources()
    rt = SparkRuntime(t, str(tmp_path / "run"), RuntimeSettings(drain=True, intervals=2))
    rt.run(timeout_s=600)
    spark = _got(rt.values("joined"))
    assert sorted(spark, key=str) == sorted(_got(h.values("joined")), key=str)
    # production ids are each run's own (a key's life is named by the batch that started it,
    # millwheel/_identity.py): unique in the run, the timestamps the harness's
    assert len({r.id for r in rt.output("joined")}) == len(rt.output("joined"))
    assert sorted(r.timestamp for r in rt.output("joined")) == sorted(
        r.timestamp for r in h.output("joined")
    )
    assert set(spark) == _pandas(lefts, rights, 1_000, 2_000, "left") and len(spark) == len(
        set(spark)
    )
    assert (
        rt.computations["WindowedJoin"].metrics["late"] == 0
    )  # each source is in time order: nothing is late
