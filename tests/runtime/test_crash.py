"""Crash test: a two-stage topology over >= 100k records survives kill -9 of the driver and of
Python workers at chosen points; the final output equals the answer computed in pandas,
with no duplicate and no loss (``docs/architecture.md``, "Where each guarantee is enforced").

Kill points are chosen by progress — after a number of committed micro-batches of a
query, read from its checkpoint — not by seconds, so the test means the same on a fast
and a slow machine.

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

from ._procs import kill_a_worker, kill_group, start, wait_for_progress, write_logs

pytestmark = pytest.mark.spark

N = 100_000
#: small injector batches and two stream files per computation batch: ~15 micro-batches
#: per stage, so kills land between many output writes, commits and publications
PACING = ("--max-bytes", "600000", "--per-trigger", "2")


def _expected(records):
    df = pd.DataFrame(records)
    df["window_start"] = df["ts"] // 1000 * 1000
    return Counter({(int(w), q, int(c)) for (w, q), c in df.groupby(["window_start", "query"]).size().items()})


def _crash_loop(tmp_path, plan, seed, layout="intervals", extra=(), records=N):
    """``plan``: ("driver" | "worker", (query, committed batches)) kills, or ("inject:<crash spec>", None).

    A kill waits for ``query`` to commit that many more batches (plus a random 0-2, from
    ``seed``) in the new driver process, then kills. ``layout``: the state layout of every
    driver of the run (``RuntimeSettings.state_layout``); ``extra``: more driver arguments
    (``--columnar``); ``records``: how many log records (a short test's fewer).
    """
    rng = random.Random(seed)
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    records = write_logs(data, records, files=20, keys=300)
    kills = Counter()
    for what, at in plan:
        crash = {"MILLWHEEL_CRASH": what.split(":", 1)[1]} if what.startswith("inject:") else None
        proc = start(root, data, "twostage", *PACING, *extra, env={"MILLWHEEL_STATE_LAYOUT": layout, **(crash or {})}, log=log)
        try:
            if crash:
                proc.wait(timeout=300)
                kills["injected"] += proc.returncode == -9
                continue
            query, batches = at
            if not wait_for_progress(proc, root, query, batches + rng.randint(0, 2)):
                continue  # it finished before the kill point
            if what == "driver":
                kill_group(proc)
                kills["driver"] += 1
            else:
                killed = False
                while proc.poll() is None and not killed:
                    killed = kill_a_worker(proc)
                    time.sleep(0 if killed else 0.05)
                kills["worker"] += killed and proc.poll() is None
                proc.wait(timeout=600)  # the driver restarts the failed query and finishes
        finally:
            kill_group(proc)
    final = start(root, data, "twostage", *PACING, *extra, env={"MILLWHEEL_STATE_LAYOUT": layout}, log=log)
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


@pytest.mark.parametrize("layout", ["intervals", "keys"])
def test_crash_short(tmp_path, layout):
    kills = _crash_loop(
        tmp_path,
        [("inject:Tally:after_output:data", None), ("driver", ("WindowCounter", 3)), ("worker", ("Tally", 2))],
        seed=1,
        layout=layout,
    )
    assert kills["injected"] == 1
    assert kills["driver"] + kills["worker"] >= 1


@pytest.mark.slow
def test_crash_long(tmp_path):
    plan = [("driver", (q, 1)) for q in ("WindowCounter", "Tally", "injector.queries") * 2]
    plan += [("worker", (q, 1)) for q in ("WindowCounter", "Tally") * 3]
    random.Random(7).shuffle(plan)
    kills = _crash_loop(tmp_path, [("inject:WindowCounter:mid_publish:data", None), ("inject:Tally:before_commit:data", None), *plan], seed=7)
    assert kills["driver"] >= 5 and kills["worker"] >= 5
