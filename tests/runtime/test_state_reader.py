"""``millwheel state``: a computation's committed per-key state, timers and dedup ids, read from a run directory.

The computation keeps a count per key and a wall-time reminder a day ahead, which is still
pending when the run has drained (only low-watermark timers hold a low watermark). At the
final watermark a step collects every id older than +inf less the slack
(``_contract.dedup_horizon``), so the records are stamped within the slack of it: the
finished run keeps their ids, and the same key sent three times keeps three.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from millwheel import (
    MAX_TIMESTAMP,
    ColumnarComputation,
    Computation,
    ComputationOptions,
    Record,
    SampleSource,
    TimeDomain,
    Topology,
)
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._state_reader import parse_key, read_state, state_main

pytestmark = pytest.mark.spark

DAY_MS = 86_400_000


class Remember(Computation):
    def process_record(self, record):
        self.state.set(
            {"count": self.state.get({"count": 0})["count"] + 1, "last": record.value["word"]}
        )
        self.set_timer("remind", self.now + DAY_MS, TimeDomain.WALL_TIME)

    def process_timer(self, timer):
        pass


@pytest.fixture(scope="module")
def finished_run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("state") / "run"
    words = ["cats", "dogs", "cats", "cats", ("tuple", 7)]
    t = Topology("remember")
    t.injector(
        "words",
        SampleSource(
            [
                Record(None, {"word": w, "key": w}, MAX_TIMESTAMP - 10_000 + i, f"w{i}")
                for i, w in enumerate(words)
            ]
        ),
    )
    t.computation(Remember, inputs={"words": lambda r: r.value["key"]})
    rt = SparkRuntime(t, str(root), RuntimeSettings(intervals=2), spark=spark)
    rt.run(timeout_s=300)
    return str(root)


def test_the_committed_state_timers_and_dedup_ids_of_every_key(spark, finished_run):
    before = time.time() * 1000
    cs = read_state(spark, finished_run, "Remember")
    assert cs.batch is not None
    keys = {k.key: k for k in cs.keys}
    assert set(keys) == {"cats", "dogs", ("tuple", 7)}
    assert keys["cats"].state == {"count": 3, "last": "cats"}
    tag, (ts, domain) = next(iter(keys["cats"].timers.items()))
    assert (tag, domain) == ("remind", "wall_time") and ts > before  # a day ahead of the run
    assert keys["cats"].dedup_ids == 3 and keys["dogs"].dedup_ids == 1
    assert keys["cats"].hold is None  # wall-time timers hold no low watermark
    assert read_state(spark, finished_run, "Remember", key=("tuple", 7)).keys[0].state["count"] == 1


class ColumnarRemember(ColumnarComputation):
    """``Remember`` on the columnar path: a count per key in the interval's store, and the reminder."""

    record_columns = ("key", "timestamp")

    def process_batch(self, batch):
        n = (
            batch.records.groupby("key", sort=False, observed=True)
            .size()
            .rename("count")
            .reset_index()
        )
        old = batch.state
        if len(old):
            n = (
                pd.concat([old, n])
                .groupby("key", sort=False, as_index=False, observed=True)["count"]
                .sum()
            )
        batch.set_state(n)
        batch.set_timers(
            n["key"], ["remind"] * len(n), [batch.now + DAY_MS] * len(n), TimeDomain.WALL_TIME
        )

    def process_timers(self, batch, timers):
        pass


@pytest.mark.parametrize("mapping", ["default", "arrow"])
def test_a_columnar_computations_state_is_read_per_key_on_either_mapping(
    spark, tmp_path, mapping, capsys
):
    """A columnar computation keeps one store per key interval (Spark's state store on the
    default mapping, its own files on the Arrow mapping): ``millwheel state`` shows it per key."""
    root = tmp_path / "run"
    words = ["cats", "dogs", "cats", "cats", ("tuple", 7)]
    t = Topology("remember-columnar")
    t.injector(
        "words",
        SampleSource([Record(None, {"key": w}, 1_000 + i, f"w{i}") for i, w in enumerate(words)]),
    )
    t.computation(
        ColumnarRemember,
        name="Remember",
        inputs={"words": lambda r: r.value["key"]},
        options=ComputationOptions(mapping=mapping),
    )
    before = time.time() * 1000
    SparkRuntime(t, str(root), RuntimeSettings(intervals=2), spark=spark).run(timeout_s=300)
    rt = SparkRuntime(t, str(root), RuntimeSettings(intervals=2), spark=spark)
    assert {k: v["count"] for k, v in rt.states("Remember").items()} == {
        "cats": 3,
        "dogs": 1,
        ("tuple", 7): 1,
    }
    cs = read_state(spark, str(root), "Remember")
    assert cs.batch is not None
    keys = {k.key: k for k in cs.keys}
    assert set(keys) == {"cats", "dogs", ("tuple", 7)}
    assert keys["cats"].state["count"] == 3 and keys["dogs"].state["count"] == 1
    tag, (ts, domain) = next(iter(keys["cats"].timers.items()))
    assert (tag, domain) == ("remind", "wall_time") and ts > before
    assert keys["cats"].hold is None and keys["cats"].state_bytes > 0
    assert state_main([str(root), "Remember", "--key", "cats"]) == 0
    out = capsys.readouterr().out
    assert "key 'cats'" in out and "'remind'" in out, out


def test_the_command_prints_a_table_one_key_or_json(spark, finished_run, capsys):
    assert state_main([finished_run, "Remember"]) == 0
    out = capsys.readouterr().out
    assert (
        "computation Remember of run" in out
        and "keys 3" in out
        and "pending timers 3 (0 low-watermark, 3 wall-time)" in out
    )
    assert "'cats'" in out and "'count': 3" in out
    assert state_main([finished_run, "Remember", "--key", "cats"]) == 0
    out = capsys.readouterr().out
    assert (
        "key 'cats'" in out
        and "timer 'remind' at" in out
        and "wall time)" in out
        and "dedup ids 3" in out
    )
    assert state_main([finished_run, "Remember", "--key", '["tuple", 7]', "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["keys"][0]["key"] == ["tuple", 7] and data["keys"][0]["state"]["count"] == 1
    assert state_main([finished_run, "Remember", "--key", "mice"]) == 1
    assert "no committed state for key 'mice'" in capsys.readouterr().out


def test_the_command_says_what_is_wrong(finished_run, tmp_path, capsys):
    assert state_main([finished_run, "Rememberer"]) == 2
    assert "has no computation 'Rememberer'; its computations: Remember" in capsys.readouterr().err
    assert state_main([str(tmp_path)]) == 2
    assert "is not a millwheel run directory" in capsys.readouterr().err
    assert state_main([finished_run]) == 0
    assert capsys.readouterr().out.split() == ["Remember"]


def test_keys_on_the_command_line():
    assert parse_key("7") == 7 and parse_key('["a", 1]') == ("a", 1) and parse_key("cats") == "cats"
