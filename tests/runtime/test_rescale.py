"""``millwheel rescale`` on Spark: a stopped run's computations move to other key-interval
counts, and the run resumes exactly once (docs/runtime.md, "Rescaling key intervals").

The two-stage topology of the crash tests (JSON-lines logs -> ``WindowCounter``, 1 s
buckets with low-watermark timers and dedup -> ``Tally`` -> ``tallies``) runs in driver
processes (``crash_driver.py``) stopped by progress: part of its input with 4 intervals,
a clean stop, both computations rescaled to 8; more input, a kill -9 inside a batch whose
state files are written but not committed, rescaled to 2 (the rescale drops that batch); then
the resumed driver is killed by the crash hook inside the batch that moves the state,
before its commit, and a last driver finishes. The final output equals the answer
computed in pandas and the harness's, with no record lost or counted twice.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import interval_of
from millwheel.runtime._rescale import rescale
from millwheel.runtime._spark_internals import committed_batches as committed_list
from millwheel.runtime._spark_internals import read_interval_states
from millwheel.runtime._streams import FileStreamLog
from millwheel.runtime._wire import RowKind

from ._procs import committed_batches, expected_tallies, kill_group, start, write_logs

pytestmark = pytest.mark.spark

N = 30_000
PACING = ("--max-bytes", "150000", "--per-trigger", "2", "--intervals", "4")
COMPUTATIONS = ("WindowCounter", "Tally")


def _layout(root) -> dict:
    return json.loads((root / "run.json").read_text()).get("computations", {})


def _stop(proc, how: str) -> None:
    if how == "clean":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: SparkRuntime.stop() stops the queries
        proc.wait(timeout=300)
    kill_group(proc)


@pytest.mark.slow  # ~90 s of Spark: the long form (-m slow), to keep CI under 25 minutes on 2 cores
def test_rescale_4_to_8_to_2_resumes_exactly_once(tmp_path, spark):
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    records = write_logs(data, N, files=15, keys=200)
    progress = []

    # part of the input with 4 intervals, then a clean stop once Tally holds state
    proc = start(root, data, "twostage", *PACING, log=log)
    try:
        _wait_for_tallies(proc, root, 1, log)
        _stop(proc, "clean")
    finally:
        kill_group(proc)
    with pytest.raises(MillwheelError, match="per-key layout|no computation 'Nope'"):
        rescale(str(root), "Nope", 8, spark=spark)
    for c in COMPUTATIONS:
        done = rescale(str(root), c, 8, spark=spark)
        assert done["from"] == 4 and done["to"] == 8
        progress.append((c, done["keys"], done["batch"], done["dropped_planned"]))
    assert {c: e["intervals"] for c, e in _layout(root).items()} == {"WindowCounter": 8, "Tally": 8}
    assert progress[0][1] > 0 and progress[1][1] > 0  # both moved keys
    tallies = len(FileStreamLog(Location.of(str(root))).read("tallies"))

    # more input with 8, then kill -9 inside a batch whose tasks wrote their state, before its commit:
    # the rescale must forget that planned batch and its state files (Spark keeps a file it
    # finds there when it runs a batch again, and the batch planned anew is another batch)
    planned = committed_batches(root, "WindowCounter") + 2
    proc = start(
        root,
        data,
        "twostage",
        *PACING,
        env={"MILLWHEEL_CRASH": f"WindowCounter:before_commit:{planned}"},
        log=log,
    )
    try:
        assert proc.wait(timeout=600) == -9, log.read_text()[-3000:]
    finally:
        kill_group(proc)
    assert len(FileStreamLog(Location.of(str(root))).read("tallies")) > tallies
    assert (
        root / "checkpoints" / "WindowCounter" / "state" / "0" / "0" / f"{planned + 1}.delta"
    ).exists()
    for c in COMPUTATIONS:
        done = rescale(str(root), c, 2, spark=spark)
        assert done["from"] == 8 and done["to"] == 2
        progress.append((c, done["keys"], done["batch"], done["dropped_planned"]))
    assert progress[2][1] > 0 and progress[3][1] > 0
    assert progress[2][3] == planned  # WindowCounter's planned batch was dropped
    layout = _layout(root)
    assert {c: e["intervals"] for c, e in layout.items()} == {"WindowCounter": 2, "Tally": 2}
    assert not set(layout["WindowCounter"]["groups"]) & set(
        json.loads((root / "run.json").read_text())["groups"]
    )

    # the resumed driver dies inside the batch that moves WindowCounter's state, before its commit
    move = committed_list(Location.of(str(root / "checkpoints" / "WindowCounter")))[-1] + 1
    proc = start(
        root,
        data,
        "twostage",
        *PACING,
        env={"MILLWHEEL_CRASH": f"WindowCounter:before_commit:{move}"},
        log=log,
    )
    try:
        rc = proc.wait(timeout=600)
    finally:
        kill_group(proc)
    assert rc == -9, log.read_text()[-3000:]
    assert (
        committed_batches(root, "WindowCounter") == move
    )  # batches 0..move-1: the move did not commit

    got = _finish(root, data, log)
    print(
        f"rescales (computation, keys, batch, dropped planned batch): {progress}; tallies {sum(got.values())}"
    )
    expected = expected_tallies(records)
    assert got == expected
    assert _harness(data) == expected
    # the state on disk (what a next driver loads, not the one in the last driver's memory):
    # every key in the group of its interval of 2, no group of an older layout left
    layout = _layout(root)
    for c in COMPUTATIONS:
        groups = layout[c]["groups"]
        ckpt = Location.of(str(root / "checkpoints" / c))
        what, states = read_interval_states(spark, ckpt.uri, committed_list(ckpt)[-1])
        assert what == "envelopes"
        assert set(states) <= set(groups), (
            f"{c}: groups of an older layout hold state: {sorted(set(states) - set(groups))}"
        )
        for g, envs in states.items():
            assert all(interval_of(kb, 2) == groups.index(g) for kb in envs)
    # the audit trail's watermarks never went back
    batches = [
        json.loads(line)
        for line in (root / "audit" / "batches" / "WindowCounter.jsonl").read_text().splitlines()
        if line
    ]
    lws = [b["lw"] for b in sorted(batches, key=lambda b: b["batch"])]
    assert lws == sorted(lws)


# ~55-90 s, so in the slow set. CI keeps: a columnar move online (test_online_rescale.py), columnar
# moves with re-deliveries without Spark (test_rescale_move.py), and kills inside a move of per-record
# computations (test_online_rescale.py's 16 -> 4 -> 32, the fault campaign's rescale_killed)
@pytest.mark.slow
def test_a_columnar_computation_is_rescaled_exactly_once_with_a_kill_in_its_move(tmp_path, spark):
    """Zeitgeist's columnar counter (``--columnar``: one store per key interval,
    ``millwheel/_colstore.py``) stopped with 4 intervals, rescaled to 8 (each store split by
    the new interval of its keys: state, timers, sequences, dedup ids), the resumed driver
    killed -9 inside the batch that moves it, before its commit; the last driver finishes,
    equal to the pandas answer, nothing published twice. The move file sends every key once,
    to its new interval's group. (Where a run puts the pieces is the property test's,
    ``test_rescale_move.py``: here the input may be read to its end by the move batch,
    which then leaves no state to look at.)"""
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    records = write_logs(data, 12_000, files=8, keys=150)
    proc = start(root, data, "twostage", *PACING, "--columnar", log=log)
    try:
        _wait_for_tallies(proc, root, 1, log)
        _stop(proc, "clean")
    finally:
        kill_group(proc)
    done = rescale(str(root), "WindowCounter", 8, spark=spark)
    assert done["from"] == 4 and done["to"] == 8 and done["keys"] > 0, done
    # the move file (read before a run prunes it): each new group got pieces holding only keys
    # of its interval, every key once, each old group a retirement
    import pyarrow.parquet as pq

    from millwheel._colstore import ColumnarStore

    groups = _layout(root)["WindowCounter"]["groups"]
    rows = pq.read_table(root / "heartbeats" / "WindowCounter" / done["file"]).to_pylist()
    installs = [r for r in rows if r["kind"] == int(RowKind.INSTALL)]
    assert installs and {r["group"] for r in rows if r["kind"] == int(RowKind.RETIRE)} == set(
        json.loads((root / "run.json").read_text())["groups"]
    )
    placed = Counter()
    for r in installs:
        kbs = ColumnarStore.decode(r["value"]).keys_held()
        assert all(interval_of(kb, 8) == groups.index(r["group"]) for kb in kbs)
        placed.update(kbs)
    assert len(placed) == done["keys"] and max(placed.values()) == 1

    move = committed_list(Location.of(str(root / "checkpoints" / "WindowCounter")))[-1] + 1
    proc = start(
        root,
        data,
        "twostage",
        *PACING,
        "--columnar",
        env={"MILLWHEEL_CRASH": f"WindowCounter:before_commit:{move}"},
        log=log,
    )
    try:
        assert proc.wait(timeout=600) == -9, log.read_text()[-3000:]
    finally:
        kill_group(proc)
    assert committed_batches(root, "WindowCounter") == move  # the move did not commit

    assert _finish(root, data, log, "--columnar") == expected_tallies(records)


def _finish(root, data, log, *extra) -> Counter:
    """A last driver that must drain; its tallies as ``(window, query, count)``, none published twice."""
    final = start(root, data, "twostage", *PACING, *extra, log=log)
    try:
        rc = final.wait(timeout=900)
    finally:
        kill_group(final)
    assert rc == 0, log.read_text()[-4000:]
    out = FileStreamLog(Location.of(str(root))).read("tallies")
    ids = Counter(r.id for r in out)
    assert sum(n - 1 for n in ids.values()) == 0, "a tally published twice"
    return Counter((r.value["window_start"], r.value["key"], r.value["count"]) for r in out)


def _wait_for_tallies(proc, root, n: int, log, timeout: float = 300) -> None:
    """Until ``n`` tallies are published (Tally then holds state), while the driver runs."""
    import time

    deadline = time.monotonic() + timeout
    streams = FileStreamLog(Location.of(str(root)))
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if (root / "streams" / "tallies").exists() and len(streams.read("tallies")) >= n:
            return
        time.sleep(0.2)
    msg = f"fewer than {n} tallies within {timeout}s"
    raise TimeoutError(msg)


def _harness(data) -> Counter:
    from millwheel.testing import Harness

    from .crash_driver import build

    h = Harness(build("twostage", str(data), weak=False), raise_errors=False)
    h.run_sources()
    return Counter(
        (r.value["window_start"], r.value["key"], r.value["count"]) for r in h.output("tallies")
    )
