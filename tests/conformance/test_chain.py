"""A low-watermark timer over another computation's productions, on every Spark plan and
both kinds of computation (``docs/runtime.md``, "Low watermarks and timers").

A heartbeat may count input files no batch has planned yet, where Spark lists the query's
heartbeats before its inputs (``_consumed.input_watermarks``): the batch that reads it
then reads those files too, and fires the timers it makes due after their records. A
computation's productions carry no sender watermark in their rows; they arrived under the
watermark in force *before* that batch (``IntervalBatch.arrival``), not the one its
heartbeat raises. Judged against the raised one they were dropped as late: the paced
Zeitgeist run lost every dip that way. Checked against the batch answer of the input.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from millwheel import Record, SampleSource
from millwheel.runtime._consumed import ConsumedFiles

pytestmark = pytest.mark.spark


def test_a_timer_over_relayed_records_drops_none_as_late(plan, spark, tmp_path, second_counts):
    from millwheel.runtime import SparkRuntime

    seed = random.SystemRandom().randrange(1, 10**6)
    print(f"\nseed {seed}")
    rng = random.Random(seed)
    # each second's records over several small files, a little disorder within a file
    records = [
        Record(None, {"key": f"k{i % 3}"}, 250 * (i // 4) + rng.randrange(4), f"r{i}")
        for i in range(400)
    ]
    rt = SparkRuntime(
        second_counts(
            SampleSource(records, batch_size=4),
            relay=True,
            columnar=plan.kind == "columnar",
            mapping=plan.mapping,
        ),
        str(tmp_path / "run"),
        plan.runtime_settings(drain=True, intervals=2, poll_ms=20, heartbeat_ms=20),
        spark=spark,
    )
    rt.run(timeout_s=300)
    query = rt.computations["SecondCounts"]
    assert query.listed_first
    consumed = ConsumedFiles(query.checkpoint)
    consumed.refresh()
    # the heartbeats are the query's first source (Spark asks them first: its contract test)
    assert {i for i, _ in consumed.heartbeat_files.values()} == {0}
    out = rt.output("counts")
    assert query.metrics["late"] == 0, f"seed {seed}: relayed records judged late"
    assert second_counts.answer(out) == Counter(
        (r.value["key"], r.timestamp // 1_000 * 1_000) for r in records
    ), f"seed {seed}"
