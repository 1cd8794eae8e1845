"""``millwheel rescale --layout`` on Spark: a stopped run's computations change state layout and
the run resumes exactly once (docs/runtime.md, "Changing a computation's state layout").

The ledger topology (``faults/ledger.py``: ``LedgerWindow`` keeps each query's window ids
under low-watermark and wall-time timers, ``LedgerTally`` numbers each window) runs in
driver processes (``python -m faults.driver``) on the interval-row layout, is stopped
mid-stream, and both computations move to the per-key layout; the run resumes to the end.
The output must be the plain answer computed from the input files alone
(``faults.check.expected``), and ``millwheel check`` must find nothing lost, duplicated,
misplaced or out of sequence. The long form (``-m slow``) kills -9 the command at each of
its points, the first batch after it, and moves back to interval rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict

import pytest

from faults.check import check_run, expected
from faults.inject import kill_tree, start_driver, wait_for_progress
from faults.ledger import LEDGER, write_input
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._rescale import rescale
from millwheel.runtime._spark_internals import committed_batches, read_envelopes
from millwheel.runtime._streams import FileStreamLog

pytestmark = pytest.mark.spark

PACING = ("--max-bytes", "60000", "--per-trigger", "1", "--intervals", "4")
COMPUTATIONS = ("LedgerWindow", "LedgerTally")


def _stop(proc) -> None:
    """Ctrl-C: ``SparkRuntime.stop()`` stops the queries and marks the driver epoch stopped."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        kill_tree(proc)


def _wait_for_ledger(proc, root, n: int, log, timeout: float = 300) -> None:
    """Until ``n`` ledger records are published (both computations hold state), while the driver runs."""
    import time

    deadline = time.monotonic() + timeout
    streams = FileStreamLog(Location.of(str(root)))
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if (root / "streams" / LEDGER).exists() and len(streams.read(LEDGER)) >= n:
            return
        time.sleep(0.2)
    msg = f"fewer than {n} ledger records within {timeout}s"
    raise TimeoutError(msg)


def _driver(root, data, log, authority, env=None):
    """The ledger's driver, its watermarks kept by ``authority`` across drivers (and a layout change)."""
    env = {**authority.env(), **(env or {})}
    return start_driver(root, data, *PACING, "--authority", authority.url, env=env, log=log)


def _run_to_end(root, data, log, authority, env=None) -> int:
    proc = _driver(root, data, log, authority, env)
    try:
        return proc.wait(timeout=900)
    finally:
        kill_tree(proc)


def _last(root, computation: str) -> int:
    return committed_batches(Location.of(str(root / "checkpoints" / computation)))[-1]


def _answer_checked(root, data, log, authority) -> None:
    """The ledger's output equals the plain answer from the input files, and ``millwheel check`` is clean."""
    exp = expected(str(data))
    want: dict[tuple[str, int], list[str]] = defaultdict(list)
    for rid, (query, window, late) in exp.records.items():
        if not late:
            want[(query, window)].append(rid)
    got: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in FileStreamLog(Location.of(str(root))).read(LEDGER):
        got[(r.value["key"], r.value["window_start"])].extend(r.value["ids"])
    tail = log.read_text()[-3000:] if log.exists() else ""
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}, tail
    report = check_run(
        str(root), str(data), authority_dir=None if authority is None else authority.data_dir
    )
    print(report.text())
    assert report.clean, report.text()
    assert not report.lost and not report.duplicated and report.outputs > 0


def test_a_run_moves_to_per_key_rows_mid_stream_in_process_and_resumes_exactly_once(
    tmp_path, spark
):
    """The short form: the driver in this process (no JVM start per driver), LedgerWindow
    moved to per-key rows between two runtimes that share one watermark authority."""
    import time

    from faults.ledger import build
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from watermark_authority import Authority
    from watermark_authority.client import InProcessWatermarkClient

    data, root = tmp_path / "data", tmp_path / "run"
    write_input(data, 3_000, seed=13, files=3, keys=100)
    settings = RuntimeSettings(
        drain=True, intervals=4, max_files_per_trigger=1, poll_ms=50, heartbeat_ms=100
    )
    wm = InProcessWatermarkClient(Authority())
    rt = SparkRuntime(
        build(str(data), max_bytes=40_000), str(root), settings, spark=spark, watermarks=wm
    )
    rt.start()
    try:
        deadline = time.monotonic() + 180
        streams = FileStreamLog(Location.of(str(root)))
        while not ((root / "streams" / LEDGER).exists() and streams.read(LEDGER)):
            assert time.monotonic() < deadline, "no ledger record within 180 s"
            rt.poll()
            time.sleep(0.05)
    finally:
        rt.stop()
    moved = rescale(str(root), "LedgerWindow", layout="keys", spark=spark)
    assert moved["keys"] > 0 and moved["from_layout"] == "intervals" and moved["to"] == 4
    ckpt = root / "checkpoints" / "LedgerWindow"
    assert len(read_envelopes(spark, str(ckpt), _last(root, "LedgerWindow"))) == moved["keys"]
    SparkRuntime(
        build(str(data), max_bytes=40_000), str(root), settings, spark=spark, watermarks=wm
    ).run(timeout_s=300)
    meta = spark.read.format("state-metadata").load(str(ckpt)).select("operatorName").collect()
    assert any("transformWithState" in r[0] for r in meta)
    _answer_checked(root, data, tmp_path / "no-driver.log", None)


@pytest.mark.slow  # ~2.5 min of Spark (a JVM per driver): the long form (-m slow)
def test_an_interval_row_run_moves_to_per_key_rows_mid_stream_and_resumes_exactly_once(
    tmp_path, spark, authority
):
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    write_input(data, 6_000, seed=11, files=6, keys=150)
    proc = _driver(root, data, log, authority)
    try:
        _wait_for_ledger(proc, root, 1, log)
    finally:
        _stop(proc)
    moved = {
        c: rescale(str(root), c, 2 if c == "LedgerTally" else None, layout="keys", spark=spark)
        for c in COMPUTATIONS
    }
    assert moved["LedgerWindow"]["keys"] > 0 and moved["LedgerWindow"]["from_layout"] == "intervals"
    assert moved["LedgerTally"]["to"] == 2
    held = read_pin(Location.of(str(root)))["computations"]
    assert {c: (e["state_layout"], e["intervals"]) for c, e in held.items()} == {
        "LedgerWindow": ("keys", 4),
        "LedgerTally": ("keys", 2),
    }
    # the moved state reads back whole, from the per-key store, at the last committed batch
    ckpt = root / "checkpoints" / "LedgerWindow"
    assert (
        len(read_envelopes(spark, str(ckpt), _last(root, "LedgerWindow")))
        == moved["LedgerWindow"]["keys"]
    )
    assert _run_to_end(root, data, log, authority) == 0, log.read_text()[-4000:]
    _answer_checked(root, data, log, authority)
    meta = spark.read.format("state-metadata").load(str(ckpt)).select("operatorName").collect()
    assert any("transformWithState" in r[0] for r in meta)


def _command(root, computation: str, *args: str, env=None) -> subprocess.CompletedProcess:
    """``millwheel rescale`` as its own process (its own Spark session), for a kill -9 inside it."""
    e = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "millwheel.cli",
            "rescale",
            str(root),
            "--computation",
            computation,
            *args,
        ],
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow  # ~3 min of Spark: the long form (-m slow), to keep CI under 25 minutes on 2 cores
def test_a_layout_change_killed_at_each_point_and_in_its_first_batch_still_moves_everything_once(
    tmp_path, spark, authority
):
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    write_input(data, 15_000, seed=12, files=10, keys=300)
    proc = _driver(root, data, log, authority)
    try:
        _wait_for_ledger(proc, root, 1, log)
    finally:
        _stop(proc)
    # the command killed after building the new store, before run.json: nothing changed
    last = _last(root, "LedgerWindow")
    done = _command(
        root,
        "LedgerWindow",
        "--layout",
        "keys",
        env={"MILLWHEEL_CRASH": f"LedgerWindow:relayout_built:{last}"},
    )
    assert done.returncode == -9, done.stderr[-3000:]
    assert "computations" not in read_pin(Location.of(str(root)))
    # killed after run.json, then after the old state was set aside: a start refuses, the command finishes it
    done = _command(
        root,
        "LedgerWindow",
        "--layout",
        "keys",
        env={"MILLWHEEL_CRASH": f"LedgerWindow:relayout_pinned:{last}"},
    )
    assert done.returncode == -9, done.stderr[-3000:]
    assert _run_to_end(root, data, log, authority) != 0
    assert "interrupted before its state was in place" in log.read_text()
    assert rescale(str(root), "LedgerWindow", layout="keys", spark=spark)["finished"]
    last_tally = _last(root, "LedgerTally")
    done = _command(
        root,
        "LedgerTally",
        "--layout",
        "keys",
        env={"MILLWHEEL_CRASH": f"LedgerTally:relayout_swapping:{last_tally}"},
    )
    assert done.returncode == -9, done.stderr[-3000:]
    done = _command(root, "LedgerTally", "--layout", "keys")
    assert done.returncode == 0, done.stderr[-3000:]
    # the first batch after the change dies before its commit, and runs again
    first = _last(root, "LedgerWindow") + 1
    assert (
        _run_to_end(
            root,
            data,
            log,
            authority,
            env={"MILLWHEEL_CRASH": f"LedgerWindow:before_commit:{first}"},
        )
        == -9
    )
    assert _last(root, "LedgerWindow") == first - 1
    # on for a while, a kill -9 at a random point, and back to interval rows
    proc = _driver(root, data, log, authority)
    try:
        wait_for_progress(proc, root, "LedgerWindow", 3)
    finally:
        kill_tree(proc)
    back = rescale(str(root), "LedgerWindow", 3, layout="intervals", spark=spark)
    assert back["from_layout"] == "keys" and back["to"] == 3
    assert _run_to_end(root, data, log, authority) == 0, log.read_text()[-4000:]
    _answer_checked(root, data, log, authority)
