"""A class-data-sharing archive for the driver JVM: Spark's classes mapped, not loaded.

Starting Spark's driver JVM loads and verifies some 20,000 classes from Spark's jars
before the first query plans: ~1.5 s of a local session's ~5 s start on 2 cores, paid
again by every `millwheel run`, every test that starts Spark and every restart. The JDK's
application class-data sharing (CDS, JEP 350's dynamic archives: `-XX:ArchiveClassesAtExit`
once, `-XX:SharedArchiveFile` after) maps those classes already parsed and verified from
one file. This module builds that file once, with a short training run of a topology
that uses what a millwheel run uses (a log-file injector, a per-record computation with
timers, a columnar one, a sink), and gives `_session.spark_session` the options that use
it. Measured in docs/performance.md ("The main job").

* **Where.** ``$MILLWHEEL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/millwheel``, else
  ``~/.cache/millwheel``) ``/cds/spark-<pyspark version>-<key>.jsa``, the key a hash of
  the Java binary spark-submit will start (``$JAVA_HOME/bin/java`` else ``java`` on
  ``PATH``: its real path, size and time) and of the jars of the Spark home the driver
  starts from (a local session's own, ``_worker_home.py``). Another JDK, installation or
  home gets its own file; the JVM also checks the archive's JDK and class
  path itself and ignores one that does not match.
* **Built** by ``python -m millwheel.runtime._cds`` (``scripts/setup.sh`` runs it), never
  during a run: the training run's JVM writes the archive as it exits, to a temporary
  name that is renamed into place only after that JVM has exited and the file is whole,
  so a run never maps a half-written archive.
* **Used** when the file exists and ``$MILLWHEEL_CDS`` is not ``0``, with the JVM's CDS
  log off (an archive that does not match is skipped silently, and the JVM starts as
  it would without one). Should the JVM still fail to start with it, the session starts
  again without it and the archive is set aside (``_session.spark_session``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from millwheel.runtime._cache import cache_dir
from millwheel.runtime._worker_home import jdk_binary, local_spark_home

CDS_ENV = "MILLWHEEL_CDS"
#: the JVM says nothing about the archive: not that it mapped it, nor why it skipped one
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def enabled() -> bool:
    return os.environ.get(CDS_ENV, "1").strip() != "0"


def _java() -> str | None:
    """The Java binary spark-submit starts (``bin/spark-class``: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``)."""
    found = jdk_binary("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def archive_path() -> Path | None:
    """Where this installation's archive is (whether or not it exists); None without Java."""
    java = _java()
    if java is None:
        return None
    import pyspark

    st = os.stat(java)
    # the jars of the home the driver starts from: the JVM maps an archive only for the
    # class path it was written with (a new home gets an archive of its own)
    home = os.environ.get("SPARK_HOME") or local_spark_home() or os.path.dirname(pyspark.__file__)
    jars = os.path.realpath(os.path.join(home, "jars"))
    key = hashlib.sha256(f"{java}\0{st.st_size}\0{st.st_mtime_ns}\0{jars}".encode()).hexdigest()[
        :16
    ]
    return cache_dir() / "cds" / f"spark-{pyspark.__version__}-{key}.jsa"


def java_options() -> str:
    """The driver JVM's options that map the archive; empty without one (or with ``MILLWHEEL_CDS=0``)."""
    if not enabled():
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def set_aside(options: str) -> None:
    """The JVM did not start with the archive in ``options``: move it out of the way (kept for a look)."""
    for part in options.split():
        if part.startswith("-XX:SharedArchiveFile="):
            path = part.split("=", 1)[1]
            with contextlib.suppress(OSError):
                os.replace(path, f"{path}.failed")


_TRAINING = """
import pandas as pd

from millwheel import ColumnarComputation, Computation, LogFileSource, Record, Timer, Topology


class PerKey(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.set_timer("end", record.timestamp // 1000 * 1000 + 1000)

    def process_timer(self, timer: Timer) -> None:
        self.produce("per_key", (self.key, self.state.get(0)))


class Columns(ColumnarComputation):
    record_columns = ("key", "timestamp")

    def process_batch(self, batch):
        n = batch.records.groupby("key", observed=True).size().rename("n").reset_index()
        rows = pd.concat([batch.state, n]).groupby("key", observed=True, as_index=False)["n"].sum()
        batch.set_state(rows.astype({"n": "int64"}))


topology = Topology("cds-training")
topology.injector("events", LogFileSource("logs", finite=True))
topology.computation(PerKey, inputs={"events": lambda r: r.value["k"]}, outputs=["per_key"])
topology.computation(Columns, inputs={"events": lambda r: r.value["k"]}, outputs=[])
topology.sink("per_key")
"""


def _jvm_running(marker: str) -> bool:
    """Whether a process's command line still names ``marker`` (the training JVM, writing its archive)."""
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return True
        except OSError:
            continue
    return False


def build(*, force: bool = False, timeout_s: float = 600.0) -> Path | None:
    """Build the archive with a training run of :data:`_TRAINING` (a few seconds of Spark);
    returns its path, or None when there is no Java or the run failed (nothing is left behind)."""
    path = archive_path()
    if path is None:
        print("millwheel: no Java found; no class-data archive built", file=sys.stderr)
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="millwheel-cds-") as work:
        logs = Path(work, "logs")
        logs.mkdir()
        for day in (1, 2):
            lines = (f'{{"k": "k{i % 7}", "ts": {day * 100_000 + i * 10}}}\n' for i in range(300))
            Path(logs, f"events-2026-01-0{day}.jsonl").write_text("".join(lines) + "not json\n")
        Path(work, "training.py").write_text(_TRAINING)
        env = {
            **os.environ,
            CDS_ENV: "0",
            "MILLWHEEL_JAVA_OPTIONS": f"-XX:ArchiveClassesAtExit={tmp} {QUIET}",
        }
        cmd = [
            sys.executable,
            "-m",
            "millwheel.cli",
            "run",
            "training.py",
            "--checkpoint",
            "run",
            "--quiet",
            "--no-ui",
        ]
        done = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        deadline = time.monotonic() + timeout_s
        while (
            _jvm_running(str(tmp)) and time.monotonic() < deadline
        ):  # the archive is written as the JVM exits
            time.sleep(0.2)
        size = -1
        while (
            tmp.is_file() and tmp.stat().st_size != size and time.monotonic() < deadline
        ):  # and without /proc: until it stops growing
            size = tmp.stat().st_size
            time.sleep(1.0)
    if (
        done.returncode != 0
        or _jvm_running(str(tmp))
        or not tmp.is_file()
        or tmp.stat().st_size == 0
    ):
        print(
            f"millwheel: the class-data training run failed (exit {done.returncode}); no archive built\n{done.stderr[-2000:]}",
            file=sys.stderr,
        )
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m millwheel.runtime._cds",
        description="Build the driver JVM's class-data archive.",
    )
    p.add_argument("--force", action="store_true", help="build it again even if it exists")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    path = build(force=args.force)
    if path is None:
        return 1
    print(
        f"millwheel: class-data archive {path} ({path.stat().st_size >> 20} MB, {time.perf_counter() - t0:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
