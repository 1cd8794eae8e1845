"""The fault helpers that need no Spark: a worker is busy when its CPU time grows, and input
progress counts the stream files a query's committed batches consumed, not its batches."""

from __future__ import annotations

import subprocess
import sys
import time

from faults.inject import consumed_inputs, cpu_ticks


def _ticks_after(pid: int, seconds: float) -> int:
    before = cpu_ticks(pid)
    time.sleep(seconds)
    after = cpu_ticks(pid)
    assert before is not None and after is not None
    return after - before


def test_cpu_ticks_grow_only_while_a_process_works():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)  # both past their start
        assert _ticks_after(busy.pid, 0.2) > 0
        assert _ticks_after(idle.pid, 0.2) == 0
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    assert cpu_ticks(busy.pid) is None  # gone


def test_consumed_inputs_of_a_missing_run_is_zero(tmp_path):
    assert consumed_inputs(tmp_path, "WindowCounter") == 0
    assert consumed_inputs(tmp_path, "injector.queries") == 0
