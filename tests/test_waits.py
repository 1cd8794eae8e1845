"""The wait board (``millwheel/_waits.py``): what a run waits on, and since when, as its live status shows it."""

from __future__ import annotations

import json
import time

from millwheel.waits import STALE_MS, WaitBoard, read_waits


def test_a_wait_is_shown_until_the_dependency_answers_and_a_dead_writers_wait_expires(tmp_path):
    board = WaitBoard(tmp_path)
    now = int(time.time() * 1000)
    board.waiting(
        "the id registry at http://127.0.0.1:7310",
        since_ms=now - 5_000,
        attempts=1,
        last_error="ConnectError: refused",
    )
    board.waiting(
        "the id registry at http://127.0.0.1:7310",
        since_ms=now - 5_000,
        attempts=4,
        last_error="ConnectError: refused",
    )  # refreshed
    board.waiting(
        "sink 'pg' of stream 'counts'",
        since_ms=now - 1_000,
        attempts=2,
        last_error="OperationalError: restarting",
    )
    waits = read_waits(tmp_path)
    assert [(w.dependency, w.attempts) for w in waits] == [
        ("the id registry at http://127.0.0.1:7310", 4),
        ("sink 'pg' of stream 'counts'", 2),
    ]
    assert (
        waits[0].text().startswith("waiting on the id registry at http://127.0.0.1:7310 since ")
        and "(4 attempts; last: ConnectError: refused)" in waits[0].text()
    )
    board.done("the id registry at http://127.0.0.1:7310")
    assert [w.dependency for w in read_waits(tmp_path)] == ["sink 'pg' of stream 'counts'"]
    # a process that died while waiting leaves its entry: not refreshed, it is ignored
    (entry,) = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    old = json.loads(entry.read_text())
    entry.write_text(json.dumps({**old, "updated_ms": now - STALE_MS - 1}))
    assert read_waits(tmp_path, now_ms=now) == []
    assert read_waits(tmp_path / "nowhere") == []


def test_the_runtime_status_says_what_the_run_waits_on(tmp_path, second_counts):
    """``SparkRuntime.status()`` puts the board's waits on the computations' rows (no Spark needed to read it)."""
    from millwheel import SampleSource
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    rt = SparkRuntime(second_counts(SampleSource([])), str(tmp_path / "run"), RuntimeSettings())
    assert all("waiting" not in row for row in rt.status().values())
    WaitBoard(tmp_path / "run" / "waits").waiting(
        "the id registry at http://x",
        since_ms=int(time.time() * 1000),
        attempts=3,
        last_error="ConnectError",
    )
    status = rt.status()
    (name,) = [n for n, row in status.items() if row["kind"] == "computation"]
    assert (
        status[name]["warning"].startswith("waiting on the id registry at http://x since ")
        and "3 attempts" in status[name]["waiting"]
    )
    assert status["logs"].get("warning") is None
