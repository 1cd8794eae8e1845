"""Crash test of a columnar computation (``millwheel/_columnar.py``): ``tests/runtime/test_crash.py``'s two-stage
topology with ``ColumnarWindowCounter`` as its counter, over 100k records, through an injected
crash after the outbox is written, a kill -9 of the driver and one of a Python worker; the
final output equals the pandas answer, with no duplicate and no loss.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog

from ._procs import kill_a_worker, kill_group, start, wait_for_progress, write_logs
from .test_crash import PACING, N, _expected

pytestmark = pytest.mark.spark

COLUMNAR = (*PACING, "--columnar")


@pytest.mark.slow  # ~90 s of Spark: the long form (-m slow), to keep CI under 25 minutes on 2 cores
def test_columnar_crash_short(tmp_path):
    rng = random.Random(26)
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    records = write_logs(data, N, files=20, keys=300)
    kills = Counter()
    plan = [("inject:WindowCounter:after_output:data", None), ("driver", ("WindowCounter", 3)), ("worker", ("WindowCounter", 2))]
    for what, at in plan:
        env = {"MILLWHEEL_CRASH": what.split(":", 1)[1]} if what.startswith("inject:") else None
        proc = start(root, data, "twostage", *COLUMNAR, env=env, log=log)
        try:
            if env:
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
                proc.wait(timeout=600)
        finally:
            kill_group(proc)
    final = start(root, data, "twostage", *COLUMNAR, log=log)
    try:
        rc = final.wait(timeout=900)
    finally:
        kill_group(final)
    assert rc == 0, log.read_text()[-4000:]
    out = FileStreamLog(Location.of(str(root))).read("tallies")
    got = Counter((r.value["window_start"], r.value["key"], r.value["count"]) for r in out)
    expected = _expected(records)
    ids = Counter(r.id for r in out)
    assert sum(n - 1 for n in ids.values()) == 0  # no duplicate
    assert got == expected  # nothing lost, nothing counted twice
    assert kills["injected"] == 1
    assert kills["driver"] + kills["worker"] >= 1
