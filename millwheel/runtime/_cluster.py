"""A real Spark standalone cluster on this machine, from the installed pyspark (no download).

``millwheel cluster up --workers 2 --cores 1 --memory 1g`` starts a master and N workers
on loopback — the same JVM daemons a data center runs (``bin/spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``; pyspark's ``sbin/`` lacks
``start-master.sh``) — waits until every worker has registered, and prints the master
URL to give ``millwheel run --master`` or ``spark-submit --master``. ``millwheel cluster
status`` shows the workers, ``millwheel cluster down`` stops what ``up`` started (only
those processes: their ids are in the cluster directory, checked against their command
lines before a signal is sent).

Everything lives in the cluster directory (default ``.millwheel/cluster``):
``cluster.json`` (URLs, process ids), ``logs/`` (each daemon's output) and ``work/``
(the executors' working directories and their ``stdout``/``stderr``).

A standalone cluster has no authentication unless ``spark.authenticate`` is set; on
loopback only local users can reach it. See ``docs/deployment.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from millwheel._errors import MillwheelError
from millwheel.runtime._worker_home import local_spark_home
from servicekit.ports import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DEFAULT_DIR = os.path.join(".millwheel", "cluster")


def spark_home() -> str:
    """The installed pyspark's directory: it has ``bin/spark-class`` and ``jars/``."""
    import pyspark

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    if not os.path.exists(os.path.join(home, "bin", "spark-class")):
        msg = f"pyspark at {home} has no bin/spark-class; reinstall pyspark (pip install pyspark==4.3.0)"
        raise MillwheelError(msg)
    return home


def _alive(pid: int, marker: str) -> bool:
    """Is ``pid`` running and still the process we started (its command line names ``marker``)?

    An empty command line is a process between ``bin/spark-class`` and the ``exec`` of its
    JVM: still ours.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().split(") ", 1)[1][0] == "Z"
    except (OSError, IndexError):
        return False
    return (marker in cmd or not cmd) and not zombie


def child_processes(pid: int) -> list[int]:
    """Every process below ``pid`` (a worker's executors and their Python workers)."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class Daemon:
    """One JVM daemon of the cluster."""

    role: str
    pid: int
    port: int
    ui_port: int
    log: str
    cores: int = 0
    memory: str = ""

    @property
    def marker(self) -> str:
        return MASTER_CLASS if self.role == "master" else WORKER_CLASS

    def alive(self) -> bool:
        return _alive(self.pid, self.marker)


@dataclass
class StandaloneCluster:
    """A master and workers on loopback; see the module docstring."""

    directory: str
    host: str = "127.0.0.1"
    master: Daemon | None = None
    workers: list[Daemon] = field(default_factory=list)

    # ---- where -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.master is None:
            msg = "the cluster has no master; run `millwheel cluster up` first"
            raise MillwheelError(msg)
        return f"spark://{self.host}:{self.master.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.master.ui_port}" if self.master else ""

    @property
    def state_file(self) -> Path:
        return Path(self.directory) / "cluster.json"

    def save(self) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        data = {
            "host": self.host,
            "master": asdict(self.master) if self.master else None,
            "workers": [asdict(w) for w in self.workers],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, directory: str) -> StandaloneCluster:
        path = Path(directory) / "cluster.json"
        if not path.exists():
            msg = f"no cluster in {directory} (no cluster.json); start one with `millwheel cluster up --dir {directory}`"
            raise MillwheelError(msg)
        data = json.loads(path.read_text())
        master = Daemon(**data["master"]) if data.get("master") else None
        return cls(
            directory,
            data.get("host", "127.0.0.1"),
            master,
            [Daemon(**w) for w in data.get("workers", [])],
        )

    # ---- starting ----------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # the workers' Python processes import compiled PySpark (``_worker_home.py``)
        home = local_spark_home() or spark_home()
        env.update(
            SPARK_HOME=home,
            SPARK_LOCAL_IP=self.host,
            SPARK_LOG_DIR=str(Path(self.directory, "logs").resolve()),
            SPARK_WORKER_DIR=str(Path(self.directory, "work").resolve()),
            PYSPARK_PYTHON=sys.executable,
            SPARK_NO_DAEMONIZE="1",
        )
        if "JAVA_HOME" not in env and shutil.which("java") is None:
            msg = "no java on PATH and JAVA_HOME unset: Spark needs Java 17 (bash scripts/setup.sh installs it)"
            raise MillwheelError(msg)
        return env

    def _spawn(
        self, role: str, args: list[str], port: int, ui_port: int, cores: int = 0, memory: str = ""
    ) -> Daemon:
        logs = Path(self.directory, "logs")
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{role}.log"
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # noqa: S603
        return Daemon(role, proc.pid, port, ui_port, str(log), cores, memory)

    def start_master(self, port: int = 0, ui_port: int = 0) -> Daemon:
        port = port or free_port(self.host)
        ui_port = ui_port or free_port(self.host)
        self.master = self._spawn(
            "master",
            [MASTER_CLASS, "--host", self.host, "--port", str(port), "--webui-port", str(ui_port)],
            port,
            ui_port,
        )
        self.save()
        return self.master

    def add_worker(self, cores: int = 1, memory: str = "1g") -> Daemon:
        """Start one more worker and register it with the master."""
        n = len(self.workers)
        ui_port = free_port(self.host)
        port = free_port(self.host)
        work = Path(self.directory, "work", f"worker-{n}")
        work.mkdir(parents=True, exist_ok=True)
        args = [
            WORKER_CLASS,
            "--host",
            self.host,
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--work-dir",
            str(work.resolve()),
            self.url,
        ]
        worker = self._spawn(f"worker-{n}", args, port, ui_port, cores, memory)
        self.workers.append(worker)
        self.save()
        return worker

    def up(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        port: int = 0,
        ui_port: int = 0,
        timeout_s: float = 120,
    ) -> StandaloneCluster:
        """Start the master and ``workers`` workers; return once every worker is alive at the master."""
        if self.state_file.exists():
            running = StandaloneCluster.load(self.directory)
            if running.master is not None and running.master.alive():
                msg = f"a cluster already runs from {self.directory} at {running.url}; `millwheel cluster down --dir {self.directory}` first"
                raise MillwheelError(msg)
        self.workers = []
        self.start_master(port, ui_port)
        self.wait(0, timeout_s)
        for _ in range(workers):
            self.add_worker(cores, memory)
        self.wait(workers, timeout_s)
        return self

    # ---- observing ---------------------------------------------------------------------
    def master_json(self) -> dict[str, Any]:
        """The master's own view (its web UI's ``/json/``): workers, cores, applications."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:  # noqa: S310 - our own loopback URL
            return dict(json.loads(r.read()))

    def alive_workers(self) -> int:
        try:
            return sum(
                1 for w in self.master_json().get("workers", []) if w.get("state") == "ALIVE"
            )
        except OSError:
            return -1

    def wait(self, workers: int, timeout_s: float = 120) -> None:
        """Until the master answers and has ``workers`` alive workers."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.master is None or not self.master.alive():
                msg = f"the Spark master did not start; its log {self.master.log if self.master else '?'} says:\n{self._tail('master')}"
                raise MillwheelError(msg)
            dead = [w for w in self.workers if not w.alive()]
            if dead:
                msg = f"Spark worker {dead[0].role} exited; its log {dead[0].log} says:\n{self._tail(dead[0].role)}"
                raise MillwheelError(msg)
            if self.alive_workers() >= workers:
                return
            if time.monotonic() > deadline:
                msg = f"the cluster did not get {workers} alive workers within {timeout_s:.0f}s; logs in {Path(self.directory, 'logs')}"
                raise MillwheelError(msg)
            time.sleep(0.25)

    def _tail(self, role: str, lines: int = 15) -> str:
        try:
            return "\n".join(
                Path(self.directory, "logs", f"{role}.log")
                .read_text(errors="replace")
                .splitlines()[-lines:]
            )
        except OSError:
            return "(no log)"

    # ---- stopping ----------------------------------------------------------------------
    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> list[int]:
        """Kill worker ``index`` and everything it started (its executor, their Python workers),
        as a lost machine would; returns the process ids signalled."""
        worker = self.workers[index]
        if not worker.alive():
            return []
        family = [worker.pid, *child_processes(worker.pid)]
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return family

    def down(self, timeout_s: float = 20) -> list[str]:
        """Stop the workers, then the master: SIGTERM, then SIGKILL after ``timeout_s``."""
        stopped = []
        for d in [*self.workers, *([self.master] if self.master else [])]:
            if not d.alive():
                continue
            family = [d.pid, *child_processes(d.pid)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(d.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while d.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in family:
                if _alive(pid, "java") or pid == d.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            stopped.append(d.role)
        self.state_file.unlink(missing_ok=True)
        return stopped

    def describe(self) -> str:
        lines = [f"master {self.url}  (web UI {self.ui_url})"]
        try:
            info = self.master_json()
        except OSError as exc:
            return lines[0] + f"\n  the master does not answer: {exc}"
        for w in info.get("workers", []):
            lines.append(
                f"  worker {w.get('host')}:{w.get('port')}  {w.get('state')}  cores {w.get('coresused')}/{w.get('cores')}  memory {w.get('memoryused')}/{w.get('memory')} MB"
            )
        for a in info.get("activeapps", []):
            lines.append(
                f"  application {a.get('id')} {a.get('name')!r}  cores {a.get('cores')}  {a.get('state')}"
            )
        return "\n".join(lines)


def launcher_path() -> str:
    """The file ``spark-submit`` runs to run ``millwheel`` (``_launcher.py``)."""
    return str(Path(__file__).with_name("_launcher.py").resolve())


def cluster_main(argv: list[str]) -> int:
    """``millwheel cluster up|down|status|launcher|log-config``: a Spark standalone cluster on this machine."""
    p = argparse.ArgumentParser(
        prog="millwheel cluster",
        description="a Spark standalone cluster on this machine (loopback), from the installed pyspark",
    )
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start a master and workers; print the master URL")
    up.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    up.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    up.add_argument(
        "--memory",
        default="1g",
        help="memory per worker (executors get spark.executor.memory of it, 1g by default)",
    )
    up.add_argument(
        "--port", type=int, default=7077, help="master port (default 7077; 0: any free port)"
    )
    up.add_argument(
        "--ui-port",
        type=int,
        default=8080,
        help="master web UI port (default 8080; 0: any free port)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=120,
        help="seconds to wait for every worker to register (default 120)",
    )
    sub.add_parser(
        "launcher",
        help="print the path of the Python file to give spark-submit (then: run T.py ...)",
    )
    sub.add_parser(
        "log-config",
        help="print the path of millwheel's log4j2 file, for spark-submit --driver-java-options",
    )
    for s in (
        up,
        sub.add_parser("down", help="stop the cluster started from --dir"),
        sub.add_parser("status", help="the master and its workers"),
    ):
        s.add_argument(
            "--dir",
            default=DEFAULT_DIR,
            help=f"the cluster directory: state, logs, work (default {DEFAULT_DIR})",
        )
    args = p.parse_args(argv)
    try:
        if args.action == "launcher":
            print(launcher_path())
            return 0
        if args.action == "log-config":
            from millwheel.runtime._session import log4j2_file

            print(log4j2_file(os.environ.get("MILLWHEEL_SPARK_LOG_LEVEL", "ERROR").upper()))
            return 0
        if args.action == "up":
            if args.workers < 1 or args.cores < 1:
                msg = f"--workers and --cores must be >= 1, got {args.workers} and {args.cores}"
                raise MillwheelError(msg)
            for flag, port in (("--port", args.port), ("--ui-port", args.ui_port)):
                if port:
                    with socket.socket() as probe:
                        if probe.connect_ex(("127.0.0.1", port)) == 0:
                            msg = f"port {port} is taken; pass {flag} with another port (0: any free port)"
                            raise MillwheelError(msg)
            started = time.monotonic()
            cluster = StandaloneCluster(args.dir).up(
                args.workers, args.cores, args.memory, args.port, args.ui_port, args.timeout
            )
            print(
                f"spark standalone cluster up in {time.monotonic() - started:.1f}s: master {cluster.url}, "
                f"{args.workers} workers x {args.cores} cores x {args.memory}; web UI {cluster.ui_url}"
            )
            print(
                f"  millwheel run T.py --master {cluster.url}    ·    millwheel cluster down --dir {args.dir}"
            )
            return 0
        cluster = StandaloneCluster.load(args.dir)
        if args.action == "status":
            print(cluster.describe())
            return 0
        stopped = cluster.down()
        print(
            f"stopped {', '.join(stopped) if stopped else 'nothing (no process of this cluster was running)'}"
        )
        return 0
    except MillwheelError as exc:
        print(f"millwheel cluster: {exc}", file=sys.stderr)
        return 2
