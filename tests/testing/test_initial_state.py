"""Initial state in the harness: ``Topology.computation(..., initial_state=...)`` and
``Harness.for_computation(..., initial_state=...)`` (``millwheel/_initial_state.py``,
``millwheel/testing/_initial.py``; docs/concepts.md, "Bootstrap").

Every source form, per-record and columnar, the checks made when the topology is built, and
the differential: a computation bootstrapped from the state another harness held at a
point in time, fed the rest of the log, produces what one run over the whole log produces
and what the plain batch computation says.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from millwheel import (
    ColumnarComputation,
    Computation,
    ComputationOptions,
    MsgpackCodec,
    TimeDomain,
    Timer,
    Topology,
    TopologyError,
)
from millwheel.testing import Crash, Harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
import bootstrap_driver as bd  # noqa: E402


class Total(Computation):
    """Adds each record's value to the key's total; a low-watermark timer produces it."""

    def process_record(self, record):
        self.state.set(self.state.get(0) + record.value["n"])

    def process_timer(self, timer):
        self.produce("totals", (timer.tag, self.state.get()))


class ColTotal(ColumnarComputation):
    """The columnar form: one state row per key, ``total``."""

    record_columns = ("key", "value.n")

    def process_batch(self, batch):
        r = batch.records
        add = r.groupby("key", observed=True)["value.n"].sum().rename("total").reset_index()
        old = batch.state
        if len(old):
            add = (
                pd.concat([old[["key", "total"]], add])
                .groupby("key", observed=True)["total"]
                .sum()
                .reset_index()
            )
        batch.set_state(add)


def _harness(source, cls=Total, **kw):
    return Harness.for_computation(
        cls,
        inputs={"in": lambda r: r.value["k"]},
        outputs=["totals"],
        initial_state=source,
        **kw,
    )


def _rec(h, k, n, ts=1):
    return h.record({"k": k, "n": n}, ts)


# ---- sources --------------------------------------------------------------------------
def test_an_iterable_seeds_state_and_timers_through_the_codec():
    h = _harness(
        [("a", 5), ("b", 7, {"t": 100}), (("c", 1), 3, [Timer("w", 50, TimeDomain.WALL_TIME)])],
        options=ComputationOptions(state_codec=MsgpackCodec()),
    )
    assert sorted(map(repr, h.keys("Total"))) == sorted(map(repr, ["a", "b", ("c", 1)]))
    assert h.state("Total", "b") == 7
    assert h.timers("Total", "b") == [Timer("t", 100, TimeDomain.LOW_WATERMARK)]
    assert h.timers("Total", ("c", 1)) == [Timer("w", 50, TimeDomain.WALL_TIME)]
    # the key's low-watermark timer holds the computation's watermark, as one its code set
    h.inject("in", [_rec(h, "b", 1, 10)])
    h.advance_watermark("in", 1_000)
    assert h.run().values("totals") == [("t", 8)]
    h.advance_wall_time(to=60)
    assert h.run().values("totals") == [("w", 3)]


def test_a_dict_and_a_dataframe_with_a_state_column_or_columns():
    h = _harness({"a": 1, "b": 2})
    assert (h.state("Total", "a"), h.state("Total", "b")) == (1, 2)
    df = pd.DataFrame({"key": ["x", "y"], "state": [10, 20], "timers": [None, {"t": 5}]})
    h = _harness(df)
    assert h.state("Total", "y") == 20 and [t.tag for t in h.timers("Total", "y")] == ["t"]
    h = _harness(pd.DataFrame({"key": ["x"], "count": [3], "sum": [4.5]}))
    assert h.state("Total", "x") == {"count": 3, "sum": 4.5}


def test_json_lines_parquet_the_state_json_document_and_a_directory(tmp_path):
    lines = tmp_path / "s.jsonl"
    lines.write_text(
        json.dumps({"key": "a", "state": 1, "timers": {"t": {"ts": 9, "domain": "low_watermark"}}})
        + "\n\n"
        + json.dumps({"key": ["b", 2], "state": {"x": [1, 2]}})
        + "\n"
    )
    h = _harness(str(lines))
    assert h.state("Total", ("b", 2)) == {"x": [1, 2]}
    assert h.timers("Total", "a") == [Timer("t", 9)]
    doc = tmp_path / "state.json"  # ``millwheel state RUN C --json``
    doc.write_text(
        json.dumps(
            {"computation": "Total", "batch": 3, "keys": [{"key": "z", "state": 4, "dedup_ids": 2}]}
        )
    )
    assert _harness(doc).state("Total", "z") == 4
    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(pa.table({"key": ["p"], "state": [1]}), d / "part-0.parquet")
    pq.write_table(pa.table({"key": ["q"], "state": [2]}), d / "part-1.parquet")
    (d / "_SUCCESS").write_text("")
    h = _harness(d)
    assert (h.state("Total", "p"), h.state("Total", "q")) == (1, 2)


def test_columnar_rows_from_a_frame_an_iterable_and_json(tmp_path):
    df = pd.DataFrame({"key": ["a", "b"], "total": [3, 4]})
    h = _harness(df, cls=ColTotal)
    assert h.state("ColTotal", "a")["total"].tolist() == [3]
    h.inject("in", [_rec(h, "a", 2)])
    h.run()
    assert h.state("ColTotal", "a")["total"].tolist() == [5]
    h = _harness(
        [("a", {"total": 1}, {"t": 7}), ("b", pd.DataFrame({"total": [2]})), ("c", [{"total": 3}])],
        cls=ColTotal,
    )
    assert [h.state("ColTotal", k)["total"].tolist() for k in "abc"] == [[1], [2], [3]]
    assert h.timers("ColTotal", "a") == [Timer("t", 7)]
    f = tmp_path / "rows.jsonl"
    f.write_text(
        json.dumps({"key": "a", "total": 9})
        + "\n"
        + json.dumps({"key": "b", "state": {"total": 8}, "timers": {"t": 3}})
        + "\n"
    )
    h = _harness(f, cls=ColTotal)
    assert h.state("ColTotal", "a")["total"].tolist() == [9]
    assert h.timers("ColTotal", "b") == [Timer("t", 3)]


# ---- checks when the topology is built ------------------------------------------------
@pytest.mark.parametrize(
    ("source", "match"),
    [
        ([("a", 1), ("a", 2)], "gives key 'a' twice"),
        ([("a",)], "item 0 is tuple"),
        ([(1.5, 1)], "bad key"),
        ([("a", 1, {"t": "soon"})], "int timestamp"),
        ([("a", 1, {"t": (5, "someday")})], "domain"),
        (pd.DataFrame({"k": [1]}), "without a 'key' column"),
        (pd.DataFrame({"key": ["a", "a"], "state": [1, 2]}), "twice"),
        ("no/such/file.parquet", "does not exist"),
        (42, "must be an iterable"),
    ],
)
def test_a_bad_source_is_refused_naming_the_computation(source, match):
    t = Topology("t")
    t.injector("in")
    with pytest.raises(TopologyError, match=f"computation 'Total': initial_state.*{match}"):
        t.computation(Total, inputs=["in"], initial_state=source)
    assert "Total" not in t.computations


def test_a_bad_file_is_refused_when_built(tmp_path):
    (tmp_path / "s.csv").write_text("key,state\n")
    (tmp_path / "bad.parquet").write_text("not parquet")
    pq.write_table(pa.table({"k": [1], "state": [1]}), tmp_path / "nokey.parquet")
    t = Topology("t")
    t.injector("in")
    for name, match in (
        ("s.csv", "give a .parquet"),
        ("bad.parquet", "is not Parquet"),
        ("nokey.parquet", "without a 'key' column"),
    ):
        with pytest.raises(TopologyError, match=match):
            t.computation(Total, inputs=["in"], initial_state=tmp_path / name)


def test_a_state_the_codec_refuses_names_the_key():
    with pytest.raises(TopologyError, match="key 'a'.*cannot encode"):
        _harness([("a", {1, 2})], options=ComputationOptions(state_codec=MsgpackCodec()))


# ---- the differential -----------------------------------------------------------------
def _run(data, first, last, kind, cap=None, initial=None):
    h = Harness(bd.build(str(data), first, last, kind, cap=cap, initial_state=initial))
    h.run_sources()
    return h


@pytest.mark.parametrize("kind", ["record", "columnar"])
def test_bootstrapped_from_a_point_in_time_equals_one_run_and_the_batch_answer(tmp_path, kind):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    days = 6
    lines = bd.write_clicks(tmp_path, days, per_day=rng.randrange(150, 300), seed=seed)
    split = rng.randrange(1, days)
    whole = _run(tmp_path, 1, days, kind)
    first = _run(tmp_path, 1, split, kind, cap=bd.cap_after(split))
    state = bd.harness_state(first)
    assert any(timers for _, _, timers in state)  # the open day's timers travel with the state
    rest = _run(tmp_path, split + 1, days, kind, initial=state)
    both = first.values("daily") + rest.values("daily")
    key = lambda v: (v["window_start"], v["key"])  # noqa: E731
    assert sorted(both, key=key) == sorted(whole.values("daily"), key=key)
    assert bd.as_answer(both) == bd.batch_answer(lines)
    assert Counter(map(key, both)) == Counter(map(key, whole.values("daily")))  # one each


@pytest.mark.parametrize("kind", ["record", "columnar"])
@pytest.mark.parametrize("crash", list(Crash))
def test_a_bootstrapped_computation_recovers_from_a_crash_as_any(tmp_path, kind, crash):
    """The harness's crashes (before the checkpoint, after it, after delivery) in the first
    rounds of a bootstrapped computation: recovered from what it committed, the output is the
    same (by id: a replay delivers again what the consumer's dedup drops)."""
    lines = bd.write_clicks(tmp_path, 4, per_day=120, seed=3)
    first = _run(tmp_path, 1, 2, kind, cap=bd.cap_after(2))
    state = bd.harness_state(first)
    h = Harness(bd.build(str(tmp_path), 3, 4, kind, initial_state=state))
    batches = h.topology.injectors["clicks"].source.batches()
    crashed = 0
    for batch in batches:
        h.inject("clicks", batch.records)
        h.advance_watermark("clicks", batch.low_watermark)
        if crashed < 2:
            h.process(bd.NAME, crash=crash)
            h.restart(bd.NAME)
            crashed += 1
        h.run()
    assert crashed == 2
    once = {r.id: r.value for r in h.output("daily")}
    both = first.values("daily") + list(once.values())
    assert bd.as_answer(both) == bd.batch_answer(lines)


def test_a_columnar_frame_with_a_bad_key_is_refused_when_built():
    t = Topology("t")
    t.injector("in")
    with pytest.raises(TopologyError, match="computation 'ColTotal': initial_state has a bad key"):
        t.computation(
            ColTotal,
            inputs=["in"],
            initial_state=pd.DataFrame({"key": ["a", 1.5], "total": [1, 2]}),
        )
