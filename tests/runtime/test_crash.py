"""Crash test: a two-stage topology over >= 100k records survives kill -9 of the driver and of
Python workers at random points; the final output equals the answer computed in pandas,
with no duplicate and no loss (design.md "Guarantees we test, always").

JSON-lines logs -> ``WindowCounter`` (per query, 1 s buckets, low-watermark timers) ->
``Tally`` (per bucket) -> ``tallies``: one record per (bucket, query) with its count.
The short version runs in CI; ``pytest -m slow`` runs >= 5 driver kills and >= 5 worker kills.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pandas as pd
import pytest

from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog

from ._procs import kill_a_worker, kill_group, start, write_logs

pytestmark = pytest.mark.spark

N = 100_000
#: small injector batches and two stream files per computation batch: ~15 micro-batches
#: per stage, so kills land between many output writes, commits and publications
PACING = ("--max-bytes", "600000", "--per-trigger", "2")


def _expected(records):
    df = pd.DataFrame(records)
    df["window_start"] = df["ts"] // 1000 * 1000
    return Counter({(int(w), q, int(c)) for (w, q), c in df.groupby(["window_start", "query"]).size().items()})


def _crash_loop(tmp_path, plan, seed):
    """``plan``: a list of ("driver" | "worker" | "inject:<crash spec>", seconds after start)."""
    rng = random.Random(seed)
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    records = write_logs(data, N, files=20, keys=300)
    kills = Counter()
    for what, delay in plan:
        env = {"MILLWHEEL_CRASH": what.split(":", 1)[1]} if what.startswith("inject:") else None
        proc = start(root, data, "twostage", *PACING, env=env, log=log)
        try:
            if env:
                proc.wait(timeout=300)
                kills["injected"] += proc.returncode == -9
                continue
            deadline = time.monotonic() + delay + rng.uniform(0, 3)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            if proc.poll() is not None:
                continue  # it finished before the kill point
            if what == "driver":
                kill_group(proc)
                kills["driver"] += 1
            else:
                while proc.poll() is None and not kill_a_worker(proc) and time.monotonic() < deadline + 30:
                    time.sleep(0.2)
                kills["worker"] += proc.poll() is None
                proc.wait(timeout=600)  # the driver restarts the failed query and finishes
        finally:
            kill_group(proc)
    final = start(root, data, "twostage", *PACING, log=log)
    try:
        rc = final.wait(timeout=900)
    finally:
        kill_group(final)
    assert rc == 0, log.read_text()[-4000:]
    out = FileStreamLog(Location.of(str(root))).read("tallies")
    got = Counter((r.value["window_start"], r.value["key"], r.value["count"]) for r in out)
    expected = _expected(records)
    ids = Counter(r.id for r in out)
    duplicates = sum(n - 1 for n in ids.values()) + sum(n - 1 for n in got.values())
    losses = sum((expected - got).values())
    print(f"kills: {dict(kills)}; tallies: {len(out)}, expected {sum(expected.values())}; duplicates {duplicates}; losses {losses}")
    assert duplicates == 0
    assert losses == 0
    assert got == expected
    return kills


def test_crash_short(tmp_path):
    kills = _crash_loop(
        tmp_path,
        [("inject:Tally:after_output:data", 0), ("driver", 14), ("worker", 9)],
        seed=1,
    )
    assert kills["injected"] == 1
    assert kills["driver"] + kills["worker"] >= 1


@pytest.mark.slow
def test_crash_long(tmp_path):
    plan = [("driver", d) for d in (10, 13, 16, 11, 14, 12)] + [("worker", d) for d in (8, 10, 12, 9, 11, 10)]
    random.Random(7).shuffle(plan)
    kills = _crash_loop(tmp_path, [("inject:WindowCounter:mid_publish:data", 0), ("inject:Tally:before_commit:data", 0), *plan], seed=7)
    assert kills["driver"] >= 5 and kills["worker"] >= 5
