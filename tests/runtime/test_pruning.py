"""Pruning: consumed heartbeat and stream-log files leave the directories consumers list,
and nothing is lost (``_streams.py``, "Pruning")."""

from __future__ import annotations

from pathlib import Path

import pytest

from millwheel import Record
from millwheel.runtime import RuntimeSettings, SparkRuntime

from ._chain import chain

pytestmark = pytest.mark.spark


def test_consumed_files_are_pruned_and_every_record_arrives(spark, run_dir):
    records = [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(60)]
    t = chain("pruning", records, batch_size=6)
    rt = SparkRuntime(
        t,
        run_dir,
        RuntimeSettings(drain=True, intervals=2, prune_streams=True, poll_ms=50),
        spark=spark,
    )
    rt.run(timeout_s=600)
    assert sorted(rt.values("doubled")) == [2 * i for i in range(60)]
    assert max(rt.values("sums")) == sum(2 * i for i in range(60))
    root = Path(run_dir)
    live = [p for p in (root / "streams" / "in" / "in").iterdir() if p.suffix == ".parquet"]
    done = list((root / "streams" / "in" / "in" / "_done").iterdir())
    assert len(done) >= 5 and len(live) < len(done)
    for name in ("Double", "Sum"):
        heartbeats = [p for p in (root / "heartbeats" / name).iterdir() if p.suffix == ".parquet"]
        assert len(heartbeats) <= 3, heartbeats
    # a second driver on the finished run: its heartbeats are numbered after the kept
    # newest one (a number used again is a file the source skips: it would never drain)
    again = SparkRuntime(
        t,
        run_dir,
        RuntimeSettings(drain=True, intervals=2, prune_streams=True, poll_ms=50),
        spark=spark,
    )
    again.run(timeout_s=300)
    assert sorted(again.values("doubled")) == [2 * i for i in range(60)]
