"""A live run over growing, rotating log files, with no ``.done`` markers (MillWheel Fig. 10).

A writer appends records stamped with wall time to a file and opens a new one every few
seconds, as a server's logger does. The injector low watermark follows read progress
(the newest timestamp read minus the declared disorder), and rotation finishes the old
file, so one-second windows come out while the files are still being written, not when they
are finished. How many seconds after they close is a figure of the machine, measured by
``bench/live_logs_bench.py``, not asserted here.
"""

from __future__ import annotations

import pytest

from examples.live_logs import drive, published_windows, topology
from millwheel.runtime import RuntimeSettings, SparkRuntime

pytestmark = pytest.mark.spark

LATENESS_MS = 300
ROTATE_S = 4.0
LIVE_S = 30.0


def test_windows_come_out_seconds_after_they_close_while_files_are_still_written(tmp_path, spark):
    logs = tmp_path / "logs"
    logs.mkdir()
    settings = RuntimeSettings(intervals=2, poll_ms=50, heartbeat_ms=100)
    rt = SparkRuntime(topology(logs, LATENESS_MS), str(tmp_path / "run"), settings, spark=spark)
    written, done_at = drive(rt, logs, LIVE_S, ROTATE_S)
    assert rt.drained()

    visible = published_windows(rt)
    # every record is counted once
    assert sum(v for v in _counts(rt).values()) == len(written)
    # windows that closed well before the input was declared complete: without a watermark
    # that follows read progress, none of them could come out before ``_DONE``
    closed_live = [k for k in visible if (k[1] + 1_000) / 1000 < done_at - 10]
    assert len(closed_live) >= 3 * 10  # three keys, most of the live period
    emitted_live = [k for k in closed_live if visible[k] < done_at]
    assert len(emitted_live) >= 0.8 * len(closed_live)
    # how soon they come out depends on the machine: bench/live_logs_bench.py measures it


def _counts(rt: SparkRuntime) -> dict:
    return {(v["key"], v["start"]): v["count"] for v in rt.values("windows")}
