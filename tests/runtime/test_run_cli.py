"""``millwheel run`` as a user runs it on Spark, in a log (no terminal): what it says and serves.

One run of the README's example with a JSON-lines sink target and the Spark UI on:

* progress lines before the first batch (authority, metrics, Spark and its UI, each query),
  then one compact status line per interval;
* ``/metrics`` answers during the run, the Spark UI on loopback;
* the final table has duplicates, late records and dates; each sink says where all of
  its output is; the target holds the rows;
* running the finished run directory again answers from ``finished.json``, without Spark;
  once rescaled (``millwheel rescale``), it runs again, and its first batch moves the state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"
MILLWHEEL = str(Path(sys.executable).with_name("millwheel"))


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as r:  # noqa: S310 - the run's own loopback URLs
        return r.status, r.read().decode(errors="replace")


def test_a_run_in_a_log_says_what_it_does_serves_metrics_and_writes_its_sink(tmp_path):
    block = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    target = tmp_path / "out" / "window_counts.jsonl"
    (tmp_path / "counts.py").write_text(
        block.replace(
            'topology.sink("window_counts")', f"topology.sink('window_counts', {str(target)!r})"
        )
    )
    cmd = [
        MILLWHEEL,
        "run",
        "counts.py",
        "--checkpoint",
        "run",
        "--intervals",
        "2",
        "--status-every",
        "1",
        "--ui",
    ]
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    said: list[str] = []
    scraped: dict[str, tuple[int, str]] = {}

    def read_stderr() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            said.append(line)
            for name, pattern in (
                ("metrics", r"metrics \(Prometheus\) at (\S+)"),
                ("ui", r"Spark UI at (\S+)"),
            ):
                m = re.search(pattern, line)
                if m and name not in scraped:
                    try:
                        scraped[name] = _get(m.group(1))
                    except OSError as exc:
                        scraped[name] = (0, str(exc))

    reader = threading.Thread(target=read_stderr)
    reader.start()
    out = proc.stdout.read()  # type: ignore[union-attr]
    proc.wait(timeout=400)
    reader.join()
    err = "".join(said)
    assert proc.returncode == 0, err[-3000:]
    for expected in (
        "millwheel: running 'counts' on Spark local[*]",
        "lag dashboard at http://127.0.0.1:",
        "#metrics=http://127.0.0.1:",
        "millwheel: starting Spark (local[*])",
        "Spark UI at http://",
        "millwheel:   starting computation WindowCounter",
        "1 injector(s) and 1 computation(s) started",
    ):
        assert expected in err, (expected, err[-3000:])
    status = [line for line in said if line.startswith("[")]
    assert status and all(" | " in line and "WindowCounter in=" in line for line in status)
    assert (
        "Setting default log level" not in err
        and "NativeCodeLoader" not in err
        and "StackOverflowError" not in err
    )
    assert (
        scraped["metrics"][0] == 200
        and 'millwheel_up{topology="counts"} 1' in scraped["metrics"][1]
    )
    assert scraped["ui"][0] == 200
    ui = re.search(r"Spark UI at http://([^:/]+)", err).group(1)  # type: ignore[union-attr]
    assert ui in ("localhost", "127.0.0.1")
    header = next(line for line in out.splitlines() if "low watermark (UTC)" in line)
    assert "dup" in header and "late" in header and "lag (inputs)" in header
    assert (
        "sink window_counts: 3 records; written to" in out
        and "millwheel read run window_counts" in out
    )
    rows = [json.loads(line) for f in target.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(tuple(r["value"]) for r in rows) == [
        ("cats", 1000, 1),
        ("cats", 2000, 1),
        ("dogs", 1000, 1),
    ]

    again = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 0, again.stderr
    assert "finished on" in again.stderr and "nothing is left to do" in again.stderr
    assert "starting Spark" not in again.stderr
    assert "('cats', 1000, 1)" in again.stdout and "sink window_counts: 3 records" in again.stdout

    # rescaled after it finished: the next run starts (it does not answer from finished.json),
    # its first batch moves the state, and the output stays what it was, nothing published twice
    rescaled = subprocess.run(
        [MILLWHEEL, "rescale", "run", "--computation", "WindowCounter", "--intervals", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rescaled.returncode == 0 and "from 2 to 4" in rescaled.stdout + rescaled.stderr, (
        rescaled.stdout + rescaled.stderr
    )
    moved = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "starting Spark" in moved.stderr and "sink window_counts: 3 records" in moved.stdout
    entry = json.loads((tmp_path / "run" / "run.json").read_text())["computations"]["WindowCounter"]
    assert entry["intervals"] == 4 and entry["migration"].get("moved") is True, entry
    rows = [json.loads(line) for f in target.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(tuple(r["value"]) for r in rows) == [
        ("cats", 1000, 1),
        ("cats", 2000, 1),
        ("dogs", 1000, 1),
    ]
