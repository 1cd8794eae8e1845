"""A resumed run reports totals: counters are part of what a published batch commits (``tallies/``)."""

from __future__ import annotations

import json

import pytest

from millwheel import Computation, Record, SampleSource, Topology
from millwheel._errors import MillwheelError
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._runtime import pin_run_settings

pytestmark = pytest.mark.spark


class Count(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.produce("counted", (self.key, self.state.get()))


def _topology(n: int) -> Topology:
    records = [Record(None, {"k": f"k{i % 5}"}, i, f"r{i}") for i in range(n)]
    records.append(records[3])  # delivered twice
    t = Topology("resume")
    t.injector("in", SampleSource(records, batch_size=40))
    t.computation(Count, inputs={"in": lambda r: r.value["k"]}, outputs=["counted"])
    return t


def test_counters_survive_a_restart_and_count_each_batch_once(spark, run_dir):
    settings = RuntimeSettings(drain=True, intervals=2)
    first = SparkRuntime(_topology(200), run_dir, settings, spark=spark)
    first.run(timeout_s=300)
    m1 = dict(first.computations["Count"].metrics)
    assert (m1["records_in"], m1["duplicates"], m1["processed"]) == (201, 1, 200)
    again = SparkRuntime(_topology(200), run_dir, settings, spark=spark)
    again.run(timeout_s=300)
    m2 = again.computations["Count"].metrics
    assert (m2["records_in"], m2["duplicates"], m2["processed"], m2["productions"]) == (201, 1, 200, 200)
    assert again.injectors["in"].status()["records_out"] == 201
    assert len(again.output("counted")) == 200


def test_a_run_directory_refuses_other_intervals_or_layout(tmp_path):
    """``run.json`` pins the interval count and state layout on the first start (no Spark
    needed: the check comes before anything else is written)."""
    run = str(tmp_path / "run")
    pin_run_settings(Location.of(run), RuntimeSettings(intervals=4))  # what a first start records
    pin_run_settings(Location.of(run), RuntimeSettings(intervals=4))  # the same settings resume
    held = json.loads((tmp_path / "run" / "run.json").read_text())
    assert held == {"intervals": 4, "state_layout": "intervals"}
    with pytest.raises(MillwheelError, match=r"was started with intervals=4 \(this run: 8\).*new run directory"):
        SparkRuntime(_topology(10), run, RuntimeSettings(intervals=8)).start()
    with pytest.raises(MillwheelError, match=r"state_layout='intervals' \(this run: 'keys'\)"):
        SparkRuntime(_topology(10), run, RuntimeSettings(intervals=4, state_layout="keys")).start()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json"]  # nothing else written


def test_a_run_directory_from_before_the_pin_gets_one(tmp_path):
    (tmp_path / "run.json").write_text('{"intervals": 2}')
    pin_run_settings(Location.of(str(tmp_path)), RuntimeSettings(intervals=2))
    assert json.loads((tmp_path / "run.json").read_text()) == {"intervals": 2, "state_layout": "intervals"}
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(MillwheelError, match="is not JSON"):
        pin_run_settings(Location.of(str(tmp_path)), RuntimeSettings(intervals=2))
