"""A real Spark standalone cluster: a master and two workers on loopback, started by ``millwheel cluster up``.

A topology submitted with ``spark-submit`` (client mode) runs on both workers — each
worker's executor runs tasks — and, with one worker JVM (and everything it started) killed
with SIGKILL mid-run, as a lost machine, its sink still holds exactly the harness's answer,
which is also the plain answer computed in pandas: Spark reschedules the lost tasks on the
other worker, no loss and no duplicate (MillWheel §6: exactly-once under failures).

The kill is placed by progress (the first windows published), not by seconds. The launcher
runs ``millwheel run`` inside spark-submit's driver (``millwheel/runtime/_launcher.py``);
``millwheel run --master`` builds its own session on the URL (its flag:
``tests/runtime/test_spark_io_cli.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from millwheel.cli import load_topology
from millwheel.runtime._cluster import StandaloneCluster, launcher_path
from millwheel.runtime._session import log4j2_file
from millwheel.testing import Harness

from ._procs import committed_batches, write_logs

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        shutil.which("java") is None and "JAVA_HOME" not in os.environ, reason="needs Java"
    ),
]

BIN = Path(sys.executable).parent
N, FILES, KEYS = 6_000, 6, 30

TOPOLOGY = """
from computations.windowing import WindowCounter
from millwheel import LogFileSource, Topology

topology = Topology("cluster_counts")
topology.injector("queries", LogFileSource({data!r}, finite=True, max_bytes_per_batch={max_bytes}, lateness_ms=1_000))
topology.computation(WindowCounter, inputs={{"queries": lambda r: r.value["query"]}}, outputs=["window_counts"],
                     params={{"trailing_empty": 0}})
topology.sink("window_counts", {out!r})
"""


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "MILLWHEEL_SPARK_UI": "0",
        **extra,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    up = subprocess.run(
        [
            str(BIN / "millwheel"),
            "cluster",
            "up",
            "--dir",
            str(d),
            "--workers",
            "2",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--port",
            "0",
            "--ui-port",
            "0",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert up.returncode == 0, up.stderr + up.stdout
    assert "master spark://127.0.0.1:" in up.stdout
    try:
        yield StandaloneCluster.load(str(d))
    finally:
        down = subprocess.run(
            [str(BIN / "millwheel"), "cluster", "down", "--dir", str(d)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    return d, write_logs(d, N, files=FILES, keys=KEYS)


@pytest.fixture(scope="module")
def answer(data, tmp_path_factory):
    """The harness's output for the topology, checked against the plain answer (pandas)."""
    d, records = data
    path = tmp_path_factory.mktemp("harness") / "topology.py"
    path.write_text(
        TOPOLOGY.format(data=str(d), out=str(path.parent / "unused.jsonl"), max_bytes=25_000)
    )
    h = Harness(load_topology(str(path)))
    h.run_sources()
    got = Counter((v["key"], v["window_start"], v["count"]) for v in h.values("window_counts"))
    df = pd.DataFrame(records)
    df["w"] = df["ts"] // 1000 * 1000
    plain = Counter((q, int(w), int(c)) for (q, w), c in df.groupby(["query", "w"]).size().items())
    assert got == plain
    return got


def _topology(tmp_path: Path, data_dir: Path, max_bytes: int) -> tuple[Path, Path]:
    """The topology file; ``max_bytes`` per injector batch sets how many micro-batches the run takes."""
    out = tmp_path / "out" / "window_counts.jsonl"
    path = tmp_path / "topology.py"
    path.write_text(
        textwrap.dedent(TOPOLOGY.format(data=str(data_dir), out=str(out), max_bytes=max_bytes))
    )
    return path, out


def _sink_rows(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line]
    return rows


def _said(text: str) -> str:
    """What a run said, without Spark's INFO log (spark-submit logs at INFO until the session starts)."""
    return "\n".join(line for line in text.splitlines() if " INFO " not in line)[-4000:]


def _output(out: Path) -> Counter:
    rows = _sink_rows(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a production was written twice"
    return Counter(
        (r["value"]["key"], r["value"]["window_start"], r["value"]["count"]) for r in rows
    )


def _executors_that_ran_tasks(cluster: StandaloneCluster, before: set[Path]) -> set[str]:
    """Workers whose executor of the newest application logged a task."""
    ran = set()
    for stderr in Path(cluster.directory, "work").glob("worker-*/app-*/*/stderr"):
        app = stderr.parent.parent
        if app not in before and "Running task" in stderr.read_text(errors="replace"):
            ran.add(app.parent.name)
    return ran


def _apps(cluster: StandaloneCluster) -> set[Path]:
    return set(Path(cluster.directory, "work").glob("worker-*/app-*"))


def test_spark_submit_on_two_workers_with_one_killed_mid_run_equals_the_local_answer(
    cluster, data, answer, tmp_path
):
    """Submitted with ``spark-submit`` (client mode), run on both workers, worker-0 killed
    with SIGKILL once the first windows are out: the output is exactly the answer."""
    path, out = _topology(
        tmp_path, data[0], max_bytes=25_000
    )  # ~12 batches: the kill lands mid-run
    before = _apps(cluster)
    log = tmp_path / "driver.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [
                str(BIN / "spark-submit"),
                "--master",
                cluster.url,
                "--deploy-mode",
                "client",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.shuffle.partitions=2",
                "--driver-java-options",
                f"-Dlog4j2.configurationFile=file:{log4j2_file('ERROR')}",
                launcher_path(),
                "run",
                str(path),
                "--checkpoint",
                str(tmp_path / "run"),
                "--intervals",
                "2",
                "--status-every",
                "5",
                "--no-metrics",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240  # the kill point: the first windows are out
        while not list(out.glob("*.jsonl")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert committed_batches(tmp_path / "run", "WindowCounter") >= 1
        assert proc.poll() is None, "the run ended before the kill point:\n" + _said(
            log.read_text()
        )
        # both executors ran tasks before the kill (two shuffle partitions, one core each)
        ran_before_kill = _executors_that_ran_tasks(cluster, before)
        killed = cluster.kill_worker(0)
        assert killed, "worker-0 was not running"
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 0, _said(text)
    assert f"on {cluster.url}" in text
    assert "ran on Spark" in text
    assert ran_before_kill == {"worker-0", "worker-1"}
    assert cluster.alive_workers() == 1
    assert _output(out) == answer
    cluster.add_worker()  # the module's cluster has two workers again
