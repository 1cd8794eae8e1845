"""Columnar computations: the same answers as the per-record path, in the harness.

* ``ColumnarWindowCounter`` against ``WindowCounter``: the same productions, ids included,
  and the same counters, on data with duplicates, disorder and late records;
* the vectorised dedup against the per-record ``DedupIndex``: the same decisions on the
  same ids, a saturated filter included (every "maybe" falls back to the exact ids);
* failures: a record or timer that raises is dead-lettered with the per-record path's
  dead letter (same id), the key keeps its other records;
* strong productions survive a crash after the checkpoint.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from computations.columnar_windowing import ColumnarWindowCounter
from computations.windowing import WindowCounter
from millwheel import Computation, ComputationOptions, DedupOptions, ErrorPolicy, LatePolicy, Record
from millwheel._coldedup import ColumnarDedup
from millwheel._columnar import ColumnarComputation
from millwheel._envelope import DedupIndex, DedupStats
from millwheel.testing import Crash, Harness


def _events(seed: int, n: int = 600, keys: int = 7) -> list[list[Record]]:
    """Batches of records over ``keys`` keys: disorder inside and across batches, duplicates
    (the same id and value re-sent, sometimes batches later), records behind the watermark."""
    rng = random.Random(seed)
    sent: list[Record] = []
    batches = []
    t = 10_000
    for b in range(n // 50):
        batch = []
        for i in range(50):
            ts = t + rng.randrange(-1_500, 3_000)
            r = Record(None, f"k{rng.randrange(keys)}", ts, f"r{b}-{i}")
            batch.append(r)
            sent.append(r)
        batch += [rng.choice(sent) for _ in range(rng.randrange(0, 6))]  # duplicates
        rng.shuffle(batch)
        batches.append(batch)
        t += rng.randrange(500, 2_500)
    return batches


def _run(
    cls: type,
    batches: list[list[Record]],
    trailing: int,
    options: ComputationOptions,
    drive: Callable[..., int],
) -> Harness:
    h = Harness.for_computation(
        cls,
        name="WindowCounter",
        inputs={"q": lambda r: r.value},
        outputs=["window_counts"],
        options=options,
        params={"window_ms": 1_000, "trailing_empty": trailing},
    )
    drive(h, batches, 0)
    h.finish("q")
    h.run()
    return h


def _out(h: Harness) -> list[tuple]:
    return sorted(
        (r.id, r.timestamp, r.value["key"], r.value["window_start"], r.value["count"])
        for r in h.output("window_counts")
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("trailing", [0, 3])
@pytest.mark.parametrize("late", ["drop", "process"])
def test_columnar_window_counter_matches_the_per_record_one(seed, trailing, late, drive_windows):
    options = ComputationOptions(late=LatePolicy.drop() if late == "drop" else LatePolicy.process())
    batches = _events(seed)
    per_record = _run(WindowCounter, batches, trailing, options, drive_windows)
    columnar = _run(ColumnarWindowCounter, batches, trailing, options, drive_windows)
    assert _out(columnar) == _out(per_record)
    a, b = per_record.metrics("WindowCounter"), columnar.metrics("WindowCounter")
    for name in ("records_in", "duplicates", "late", "late_dropped", "processed", "productions"):
        assert b[name] == a[name], name
    if (
        trailing == 0
    ):  # with trailing buckets the columnar counter walks a key's chain of empty buckets itself
        assert b["timers_fired"] == a["timers_fired"]
    assert a["duplicates"] > 0 and a["late"] > 0  # the data has both
    assert columnar.keys("WindowCounter") == [] and per_record.keys("WindowCounter") == []


def test_columnar_state_and_timers_are_readable_mid_run():
    h = Harness.for_computation(
        ColumnarWindowCounter, inputs={"q": lambda r: r.value}, outputs=["window_counts"]
    )
    h.inject("q", [h.record("cats", 1_100), h.record("cats", 1_300), h.record("dogs", 2_100)])
    h.run()
    s = h.state("ColumnarWindowCounter", "cats")
    assert s[["key", "start", "count"]].values.tolist() == [["cats", 1_000, 2]]
    assert [(t.tag, t.timestamp) for t in h.timers("ColumnarWindowCounter", "cats")] == [
        ("w1000", 2_000)
    ]
    assert h.low_watermark("ColumnarWindowCounter") < 2_000  # held by the timers (and the injector)
    h.advance_watermark("q", 2_000)
    h.run()
    assert (
        h.low_watermark("ColumnarWindowCounter") == 2_000
    )  # dogs' bucket ends at 3000: it holds at 2000 (the input's)
    assert [v["count"] for v in h.values("window_counts")] == [2]


# ---------------------------------------------------------------------------- dedup
def _per_record_decisions(batches, capacity=None, fpr=0.01):
    """Decisions of the per-record dedup (one DedupIndex per key), batch by batch."""
    idx: dict[bytes, DedupIndex] = {}
    out = []
    stats = DedupStats()
    for ids, kbs in batches:
        res = []
        by_key: dict[bytes, list[int]] = {}
        for i, kb in enumerate(kbs):
            by_key.setdefault(kb, []).append(i)
        keep = [True] * len(ids)
        for kb, rows in by_key.items():
            d = idx.setdefault(kb, DedupIndex())
            kept = d.admit([ids[i] for i in rows], [1] * len(rows), stats)
            if kept is not None:
                for i, k in zip(rows, kept, strict=True):
                    keep[i] = k
            d.finish(0, fpr, capacity, 60_000, stats)
        res = keep
        out.append(res)
    return out


@pytest.mark.parametrize(("seed", "split"), [(5, False), (6, False), (7, True)])
def test_vectorised_dedup_decides_as_the_per_record_dedup(seed, split):
    """``split``: between batches the index is also split by key into three (as a rescale
    moves keys to other intervals, ``ColumnarDedup.split``) and merged again."""
    rng = random.Random(seed)
    pool = [f"id-{i}" for i in range(3_000)]
    keys = [f"k{i}".encode() for i in range(40)]
    key_of = {rid: rng.choice(keys) for rid in pool}
    batches = []
    for _ in range(30):
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 300))]
        # mostly each id under its own key; sometimes another key (a different record under the same id)
        kbs = [key_of[r] if rng.random() < 0.9 else rng.choice(keys) for r in ids]
        batches.append((ids, kbs))
    expected = _per_record_decisions(batches)
    d = ColumnarDedup()
    stats = DedupStats()
    got = []
    for ids, kbs in batches:
        got.append(d.admit(ids, kbs, np.ones(len(ids), np.int64), stats).tolist())
        d = ColumnarDedup.from_wire(d.to_wire())  # through its storage form, as between batches
        if split:
            parts = d.split([int(kb[1:]) % 3 for kb in d.keys])
            assert sum(len(p) for p in parts.values()) == len(d)
            d = ColumnarDedup.merge([ColumnarDedup.from_wire(p.to_wire()) for p in parts.values()])
    assert got == expected
    assert sum(not k for b in got for k in b) > 1_000  # many duplicates were caught


def test_saturated_filter_falls_back_to_exact_ids():
    """A one-item filter at 50% answers "maybe" to nearly everything: no new id may be dropped."""
    d = ColumnarDedup(fpr=0.5, capacity=1)
    stats = DedupStats()
    seen: set[tuple[str, bytes]] = set()
    rng = random.Random(9)
    dropped_new = 0
    for _ in range(20):
        ids = [f"x{rng.randrange(2_000)}" for _ in range(100)]
        kbs = [b"k"] * len(ids)
        keep = d.admit(ids, kbs, np.zeros(len(ids), np.int64), stats).tolist()
        batch_seen: set[tuple[str, bytes]] = set()
        for rid, kb, k in zip(ids, kbs, keep, strict=True):
            new = (rid, kb) not in seen and (rid, kb) not in batch_seen
            assert k == new
            dropped_new += new and not k
            batch_seen.add((rid, kb))
        seen |= batch_seen
    assert dropped_new == 0
    assert stats.bloom_false_positive > 500  # the fallback ran, and said "new" each time


def test_dedup_collects_ids_behind_the_horizon():
    d = ColumnarDedup()
    d.admit(["a", "b", "c"], [b"k"] * 3, np.array([100, 200, 5_000]))
    stats = DedupStats()
    d.collect(horizon=1_000, gc_interval_ms=0, stats=stats)
    assert (len(d), stats.ids_collected) == (1, 2)
    assert d.admit(["a", "c"], [b"k", b"k"], np.array([100, 5_000])).tolist() == [True, False]


# ---------------------------------------------------------------------------- failures
class _Fussy(Computation):
    def process_record(self, record):
        if record.value.get("bad"):
            msg = f"bad record {record.id}"
            raise ValueError(msg)
        self.state.set((self.state.get() or 0) + 1)
        self.set_timer("t", record.timestamp + 10)

    def process_timer(self, timer):
        if self.key == "boom":
            msg = "timer failed"
            raise RuntimeError(msg)
        self.produce("out", (self.key, self.state.get()))


class _ColumnarFussy(ColumnarComputation):
    def process_batch(self, batch):
        r = batch.records
        if any(v.get("bad") for v in r["value"]):
            bad = next(i for i, v in zip(r["id"], r["value"], strict=True) if v.get("bad"))
            msg = f"bad record {bad}"
            raise ValueError(msg)
        n = r.groupby("key", sort=False, observed=True).size().rename("n").reset_index()
        old = batch.state
        if len(old):
            n = (
                pd.concat([old, n])
                .groupby("key", sort=False, as_index=False, observed=True)["n"]
                .sum()
            )
        batch.set_state(n)
        last = r.groupby("key", sort=False, observed=True)["timestamp"].max()
        batch.set_timers(last.index, ["t"] * len(last), last.to_numpy() + 10)

    def process_timers(self, batch, timers):
        if "boom" in set(timers["key"]):
            msg = "timer failed"
            raise RuntimeError(msg)
        s = batch.state.set_index("key")["n"]
        keys = timers["key"].tolist()
        batch.produce(
            "out",
            [(k, int(s[k])) for k in keys],
            keys=keys,
            timestamps=timers["timestamp"].to_numpy(),
        )


@pytest.mark.parametrize("cls", [_Fussy, _ColumnarFussy])
def test_failures_are_dead_lettered_as_on_the_per_record_path(cls):
    results = {}
    for c in (_Fussy, cls):
        h = Harness.for_computation(
            c,
            name="Fussy",
            inputs={"q": lambda r: r.value["k"]},
            outputs=["out"],
            options=ComputationOptions(on_error=ErrorPolicy.DEAD_LETTER),
            raise_errors=False,
        )
        h.inject(
            "q",
            [
                h.record({"k": "a"}, 100, id="1"),
                h.record({"k": "a", "bad": 1}, 101, id="2"),
                h.record({"k": "a"}, 102, id="3"),
                h.record({"k": "b"}, 100, id="4"),
                h.record({"k": "boom"}, 100, id="5"),
            ],
        )
        h.finish("q")
        h.run()
        dead = sorted((d.id, d.value.stage, d.value.reason, d.value.key) for d in h.dead_letters())
        results[c] = (
            sorted((r.id, r.value) for r in h.output("out")),
            dead,
            h.metrics("Fussy")["processed"],
        )
    assert results[cls] == results[_Fussy]
    out, dead, processed = results[cls]
    assert sorted(v for _, v in out) == [("a", 2), ("b", 1)]
    assert [(s, k) for _, s, _, k in dead] == sorted(
        [("process_record", "a"), ("process_timer", "boom")]
    )
    assert processed == 4


def test_strong_productions_survive_a_crash_after_the_checkpoint():
    h = Harness.for_computation(
        ColumnarWindowCounter,
        inputs={"q": lambda r: r.value},
        outputs=["window_counts"],
        params={"trailing_empty": 0},
    )
    h.inject("q", [h.record("cats", 1_100), h.record("dogs", 1_200)])
    h.advance_watermark("q", 2_000)
    h.process("ColumnarWindowCounter", crash=Crash.AFTER_COMMIT)
    assert h.values("window_counts") == []
    assert len(h._columnar["ColumnarWindowCounter"].pending()) == 2  # checkpointed in the store
    h.restart("ColumnarWindowCounter")
    h.run()
    assert Counter((v["key"], v["count"]) for v in h.values("window_counts")) == Counter(
        {("cats", 1): 1, ("dogs", 1): 1}
    )
    h.finish("q")
    h.run()
    assert len(h.values("window_counts")) == 2


def test_a_crash_before_the_checkpoint_leaves_the_store_as_it_was():
    """The harness keeps the store decoded between rounds: a round works on a copy, so a
    crash before its checkpoint changes nothing, and the input is processed again once."""
    h = Harness.for_computation(
        ColumnarWindowCounter,
        inputs={"q": lambda r: r.value},
        outputs=["window_counts"],
        params={"trailing_empty": 0},
    )
    h.inject("q", [h.record("cats", 1_100, id="a")])
    h.run()
    before = (
        h.state("ColumnarWindowCounter", "cats")["count"].tolist(),
        h.dedup_ids("ColumnarWindowCounter", "cats"),
        h.timers("ColumnarWindowCounter", "cats"),
    )
    h.inject("q", [h.record("cats", 1_200, id="b"), h.record("dogs", 1_300, id="c")])
    h.process("ColumnarWindowCounter", crash=Crash.BEFORE_COMMIT)
    after = (
        h.state("ColumnarWindowCounter", "cats")["count"].tolist(),
        h.dedup_ids("ColumnarWindowCounter", "cats"),
        h.timers("ColumnarWindowCounter", "cats"),
    )
    assert after == before and h.state("ColumnarWindowCounter", "dogs") is None
    h.restart("ColumnarWindowCounter")
    h.finish("q")
    h.run()
    assert sorted((v["key"], v["count"]) for v in h.values("window_counts")) == [
        ("cats", 2),
        ("dogs", 1),
    ]
    assert h.metrics("ColumnarWindowCounter")["duplicates"] == 0


def test_columnar_misuse_is_a_clear_error():
    class Wrong(ColumnarComputation):
        def process_batch(self, batch):
            batch.set_timers(["not-a-key-of-this-call"], ["t"], [5])

    h = Harness.for_computation(Wrong, inputs={"q": lambda r: r.value}, outputs=[])
    h.inject("q", [h.record("cats", 1)])
    with pytest.raises(Exception, match="not one of this call's keys"):
        h.run()


def test_records_always_carry_their_key_even_when_record_columns_leave_it_out():
    """A user's computation keyed by record id that asks only for ids and timestamps: the
    runner groups by key and reads the column back (it failed with a bare ``KeyError``)."""

    class ById(ColumnarComputation):
        record_columns = ("id", "timestamp")

        def process_batch(self, batch):
            r = batch.records
            assert list(r.columns) == ["key", "id", "timestamp"]
            batch.produce("out", r["id"].tolist(), keys=r["key"], timestamps=r["timestamp"])

    h = Harness.for_computation(ById, inputs={"q": lambda r: r.id}, outputs=["out"])
    h.inject("q", [h.record("a", 1, id="x"), h.record("b", 2, id="y"), h.record("a", 1, id="x")])
    assert sorted(h.run().values("out")) == ["x", "y"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (("key", "ts"), r"names \['ts'\], not columns of a batch's records: key, id, timestamp"),
        (("key", "value."), r"names \['value.'\]"),
        ("key", "record_columns is a tuple of column names, got 'key'"),
    ],
)
def test_a_record_column_that_is_not_one_is_refused_as_the_class_is_defined(columns, message):
    from millwheel._errors import DeclarationError

    with pytest.raises(DeclarationError, match=message):
        type("Typo", (ColumnarComputation,), {"record_columns": columns})


def test_dedup_option_is_honoured():
    opts = ComputationOptions(exactly_once=False, dedup=DedupOptions())
    h = Harness.for_computation(
        ColumnarWindowCounter,
        inputs={"q": lambda r: r.value},
        outputs=["window_counts"],
        options=opts,
        params={"trailing_empty": 0},
    )
    h.inject("q", [h.record("cats", 1_100, id="a"), h.record("cats", 1_100, id="a")])
    h.finish("q")
    h.run()
    assert [v["count"] for v in h.values("window_counts")] == [2]


def test_harness_seeds_and_inspects_columnar_state():
    h = Harness.for_computation(
        ColumnarWindowCounter,
        inputs={"q": lambda r: r.value},
        outputs=["window_counts"],
        params={"trailing_empty": 0},
    )
    h.set_state(
        "ColumnarWindowCounter",
        "cats",
        pd.DataFrame({"start": [1_000], "count": [5], "empty_run": [0]}),
    )
    h.inject("q", [h.record("cats", 1_100, id="x"), h.record("dogs", 1_200, id="y")])
    h.run()
    assert h.state("ColumnarWindowCounter", "cats")["count"].tolist() == [6]
    assert h.dedup_ids("ColumnarWindowCounter", "cats") == {"x"}
    h.advance_watermark("q", 2_000)
    h.process("ColumnarWindowCounter", deliver=False)
    assert [
        p.record.value["count"] for p in h.pending_productions("ColumnarWindowCounter", "cats")
    ] == [6]
    h.run()
    assert sorted((v["key"], v["count"]) for v in h.values("window_counts")) == [
        ("cats", 6),
        ("dogs", 1),
    ]
