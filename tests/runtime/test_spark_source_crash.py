"""``SparkSource`` under kill -9: the ``rate`` source and the shipped Python Data Source
are exact after the driver is killed mid-run, twice, and resumed (issue 25).

Spark's offset log is the injector's checkpoint: the batch replayed after a kill reads the
same offsets, so it injects the same records under the same ids (``value``, ``seq``) and
the same sender watermark, and only its committed version is published. The per-key
counts per second must equal the plain batch answer, with no record injected twice and
no count produced twice.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from examples.sequence_source import events
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog

from ._procs import kill_group, wait_for_progress
from .spark_io_driver import RATE_N, SEQ, T0

pytestmark = pytest.mark.spark

DRIVER = str(Path(__file__).with_name("spark_io_driver.py"))


def _start(root, kind, log):
    out = open(log, "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, DRIVER, str(root), kind],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _expected(kind):
    if kind == "rate":
        return Counter((f"k{v % 9}", (T0 + v * 10) // 1000 * 1000) for v in range(RATE_N)), RATE_N
    rows = [r for r in events(**SEQ) if r["ts"] is not None]
    return Counter((r["key"], r["ts"] // 1000 * 1000) for r in rows), len(rows)


# the sequence source: slow (-m slow); in CI its driver is killed mid-run, and killed inside
# its sink, by tests/runtime/test_spark_sink.py::test_postgres_sink_is_exact_after_kill_9
@pytest.mark.parametrize("kind", ["rate", pytest.param("sequence", marks=pytest.mark.slow)])
def test_exact_after_kill_9(tmp_path, kind):
    root, log = tmp_path / "run", tmp_path / "driver.log"
    kills = 0
    for query, batches in (("injector.logs", 2), ("SecondCounts", 2)):
        proc = _start(root, kind, log)
        try:
            if wait_for_progress(proc, root, query, batches, timeout=400):
                kill_group(proc)
                kills += 1
        finally:
            kill_group(proc)
    final = _start(root, kind, log)
    try:
        rc = final.wait(timeout=900)
    finally:
        kill_group(final)
    assert rc == 0, log.read_text()[-4000:]
    streams = FileStreamLog(Location.of(str(root)))
    injected = streams.read("events")
    counts = streams.read("counts")
    expected, n = _expected(kind)
    got = Counter()
    for r in counts:
        got[(r.value["key"], r.value["second"])] += r.value["count"]
    twice = sum(c - 1 for c in Counter(r.id for r in counts).values())
    print(
        f"{kind}: kills {kills}; injected {len(injected)} ({len({r.id for r in injected})} distinct, expected {n}); counts {len(counts)}, produced twice {twice}"
    )
    assert kills == 2
    assert len({r.id for r in injected}) == n  # every record injected, under one id each
    assert twice == 0
    assert got == expected
