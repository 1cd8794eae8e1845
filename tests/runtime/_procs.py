"""Run the crash driver as a subprocess in its own process group; kill it, or one of its Python workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DRIVER = str(Path(__file__).with_name("crash_driver.py"))


def start(root, data, kind, *extra, env=None, log=None):
    e = dict(os.environ)
    e.update(env or {})
    e["PYSPARK_PYTHON"] = sys.executable
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, DRIVER, str(root), str(data), kind, *extra],
        env=e, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def kill_group(proc) -> None:
    """kill -9 the driver, then everything it started (the JVM, the Python workers)."""
    family = [pid for pid, _, _ in _descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _processes() -> list[tuple[int, int, str]]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append((int(d), ppid, cmd))
        except (OSError, ValueError):
            continue
    return out


def _descendants(root: int) -> list[tuple[int, int, str]]:
    """Every process below ``root`` (Spark's Python workers leave the process group)."""
    procs = _processes()
    children: dict[int, list[tuple[int, int, str]]] = {}
    for p in procs:
        children.setdefault(p[1], []).append(p)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def python_workers(proc) -> list[int]:
    """Pids of the Spark Python workers forked by the driver's ``pyspark.daemon``."""
    members = _descendants(proc.pid)
    daemons = {pid for pid, _, cmd in members if "pyspark.daemon" in cmd}
    return [pid for pid, ppid, _ in members if ppid in daemons]


def kill_a_worker(proc) -> bool:
    """kill -9 the Spark Python workers alive right now (at a random time one is mid-task)."""
    killed = False
    for pid in python_workers(proc):
        try:
            os.kill(pid, signal.SIGKILL)
            killed = True
        except ProcessLookupError:
            pass
    return killed


def committed_batches(root: Path, query: str) -> int:
    """How many micro-batches of ``query`` (a computation, or ``injector.<name>``) have committed."""
    commits = Path(root) / "checkpoints" / query / "commits"
    if not commits.is_dir():
        return 0
    return sum(1 for n in os.listdir(commits) if n.isdigit())


def wait_for_progress(proc, root: Path, query: str, batches: int, timeout: float = 300) -> bool:
    """Wait until ``batches`` more batches of ``query`` committed; ``False`` if ``proc`` ended first."""
    target = committed_batches(root, query) + batches
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if committed_batches(root, query) >= target:
            return True
        time.sleep(0.05)
    msg = f"{query} did not commit {batches} more batches within {timeout}s"
    raise TimeoutError(msg)


def write_logs(data: Path, n: int, files: int, keys: int, seed: int = 3) -> list[dict]:
    """``n`` JSON-lines records over ``files`` files, roughly time-ordered; returns the records."""
    import json
    import random

    rng = random.Random(seed)
    data.mkdir(parents=True, exist_ok=True)
    per = n // files
    out = []
    start = 1_700_000_000_000
    for f in range(files):
        t0 = start + f * 1_000
        lines = []
        for i in range(per):
            k = f * per + i
            rec = {"id": f"e{k}", "ts": t0 + rng.randrange(1_000), "query": f"q{rng.randrange(keys)}"}
            out.append(rec)
            lines.append(json.dumps(rec))
        (data / f"queries_{t0}.jsonl").write_text("\n".join(lines) + "\n")
    (data / "_DONE").write_text("")
    return out
