"""A resumed run reports totals: counters are part of what a published batch commits (``tallies/``)."""

from __future__ import annotations

import pytest

from millwheel import Computation, Record, SampleSource, Topology
from millwheel.runtime import RuntimeSettings, SparkRuntime

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
