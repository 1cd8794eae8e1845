"""Run the crash driver as a subprocess in its own process group; kill it, or one of its Python workers.

The process and progress helpers live in ``faults/inject.py`` (the fault campaign's) and are
re-exported here for the crash tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from faults.inject import (
    committed_batches,
    kill_python_workers,
    kill_tree,
    python_workers,
    wait_for_progress,
)

__all__ = [
    "committed_batches",
    "expected_tallies",
    "kill_a_worker",
    "kill_group",
    "python_workers",
    "start",
    "wait_for_progress",
    "write_logs",
]

DRIVER = str(Path(__file__).with_name("crash_driver.py"))


def start(root, data, kind, *extra, env=None, log=None):
    e = dict(os.environ)
    e.update(env or {})
    e["PYSPARK_PYTHON"] = sys.executable
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, DRIVER, str(root), str(data), kind, *extra],
        env=e,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_group(proc) -> None:
    """kill -9 the driver, then everything it started (the JVM, the Python workers)."""
    kill_tree(proc)


def kill_a_worker(proc) -> bool:
    """kill -9 the Spark Python workers running a task right now (their CPU time grows), if any."""
    return kill_python_workers(proc.pid, busy=True) > 0


def write_logs(
    data: Path, n: int, files: int, keys: int, seed: int = 3, *, first: int = 0, done: bool = True
) -> list[dict]:
    """``n`` JSON-lines records over ``files`` files, roughly time-ordered; returns the records.

    ``first``: the index of the first file, continuing the ids and times of an earlier call
    (a test that writes its input while the run goes on); ``done=False``: no ``_DONE``.
    """
    import json
    import random

    rng = random.Random(seed)
    data.mkdir(parents=True, exist_ok=True)
    per = n // files
    out = []
    start = 1_700_000_000_000
    for f in range(first, first + files):
        t0 = start + f * 1_000
        lines = []
        for i in range(per):
            k = f * per + i
            rec = {
                "id": f"e{k}",
                "ts": t0 + rng.randrange(1_000),
                "query": f"q{rng.randrange(keys)}",
            }
            out.append(rec)
            lines.append(json.dumps(rec))
        staged = data / f".queries_{t0}.jsonl"  # whole, as a logger rotates it in
        staged.write_text("\n".join(lines) + "\n")
        staged.rename(data / f"queries_{t0}.jsonl")
    if done:
        (data / "_DONE").write_text("")
    return out


def expected_tallies(records: list[dict]) -> Counter:
    """The two-stage topology's answer for :func:`write_logs`' records, computed by pandas:
    ``(window start, query, count)`` per one-second window and query."""
    import pandas as pd

    df = pd.DataFrame(records)
    df["window_start"] = df["ts"] // 1000 * 1000
    return Counter(
        {(int(w), q, int(c)) for (w, q), c in df.groupby(["window_start", "query"]).size().items()}
    )
