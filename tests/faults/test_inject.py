"""The fault helpers that need no Spark: a worker is busy when its CPU time grows, and input
progress counts the stream files a query's committed batches consumed, not its batches."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

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


def _refusing(times: int):
    """An ``open`` that refuses to create a file with ENOSPC ``times`` times, then opens it."""
    import errno

    calls = {"n": 0}

    def fake(path, mode="r"):
        calls["n"] += 1
        if calls["n"] <= times:
            raise OSError(errno.ENOSPC, "No space left on device")
        return open(path, mode)  # noqa: SIM115 - the caller closes it

    return fake


def test_a_ballast_refused_for_a_moment_is_made_and_a_full_device_needs_none(tmp_path, monkeypatch):
    """``SmallDisk._open_ballast``: ENOSPC on creating the ballast is tried again (seen once on
    an empty tmpfs in CI); refused for good, a device with no room left is full already (nothing
    to write), and one with room fails with its figures rather than pass a fault that filled nothing."""
    import os

    from faults import inject

    disk = inject.SmallDisk(tmp_path)
    monkeypatch.setattr(inject, "open", _refusing(3), raising=False)
    with disk._open_ballast() as f:
        f.write(b"x")
    assert disk.ballast.read_bytes() == b"x"
    monkeypatch.setattr(inject, "open", _refusing(10**6), raising=False)
    with pytest.raises(AssertionError, match="refuses a new file"):
        disk._open_ballast()
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
    monkeypatch.setattr(inject.os, "statvfs", lambda path: full)
    assert disk._open_ballast() is None
