"""A local etcd cluster for tests and benchmarks of the replicated backend.

:class:`LocalEtcdCluster` starts ``n`` etcd members (Debian's ``etcd-server``, 3.4) on
loopback, each on free ports with its data directory under ``base_dir``, and can find
the Raft leader, kill a member with SIGKILL and restart it::

    with LocalEtcdCluster(tmp_path) as cluster:          # three members
        backend = EtcdBackend(cluster.endpoints)
        cluster.kill(cluster.leader())                   # kill -9 the leader

:func:`etcd_binary` says where ``etcd`` is (``None`` if it is not installed:
``scripts/setup.sh --test`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servicekit.ports import free_ports

#: where to look for etcd besides $PATH (Debian installs it in /usr/bin)
_CANDIDATES = ("/usr/bin/etcd", "/usr/local/bin/etcd")


def etcd_binary() -> str | None:
    """The ``etcd`` executable (``$MILLWHEEL_ETCD``, else on ``$PATH``), or ``None``."""
    explicit = os.environ.get("MILLWHEEL_ETCD")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("etcd") or next((c for c in _CANDIDATES if os.access(c, os.X_OK)), None)


class LocalEtcdCluster:
    """``members`` etcd processes on loopback forming one cluster (see the module docstring)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        members: int = 3,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or etcd_binary()
        if found is None:
            msg = "etcd is not installed: run scripts/setup.sh --test (it installs Debian's etcd-server), or set $MILLWHEEL_ETCD"
            raise FileNotFoundError(msg)
        self.binary = found
        self.base_dir = Path(base_dir)
        self.extra_args = list(extra_args)
        self.names = [f"m{i}" for i in range(members)]
        ports = free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.endpoints = [f"http://127.0.0.1:{p}" for p in self.client_ports]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * members
        self._token = f"millwheel-{os.getpid()}-{time.monotonic_ns()}"

    def _command(self, i: int) -> list[str]:
        cluster = ",".join(
            f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports, strict=True)
        )
        return [
            self.binary,
            "--name",
            self.names[i],
            "--data-dir",
            str(self.base_dir / self.names[i]),
            "--listen-client-urls",
            self.endpoints[i],
            "--advertise-client-urls",
            self.endpoints[i],
            "--listen-peer-urls",
            f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self._token,
            "--heartbeat-interval",
            "100",
            "--election-timeout",
            "1000",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            *self.extra_args,
        ]

    def start_member(self, i: int, *, state: str = "new") -> None:
        """Start member ``i`` (``state="existing"``: rejoin with its data directory)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        command = self._command(i)
        command[command.index("--initial-cluster-state") + 1] = state
        log = open(self.base_dir / f"{self.names[i]}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.processes[i] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()

    def start(self, timeout: float = 60.0) -> LocalEtcdCluster:
        """Start every member and wait until the cluster has a leader and takes writes."""
        for i in range(len(self.names)):
            self.start_member(i)
        self.wait_ready(timeout)
        return self

    def _status(self, i: int, client: Any) -> dict[str, Any] | None:
        try:
            r = client.post(f"{self.endpoints[i]}/v3/maintenance/status", json={}, timeout=2.0)
        except Exception:  # noqa: BLE001 - a member down or starting
            return None
        return r.json() if r.status_code == 200 else None

    def leader(self, timeout: float = 30.0) -> int:
        """The index of the member that is the Raft leader now (waits for an election)."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client() as client:
            while True:
                for i, process in enumerate(self.processes):
                    if process is None or process.poll() is not None:
                        continue
                    status = self._status(i, client)
                    if (
                        status
                        and status.get("leader")
                        and status.get("leader") == status["header"].get("member_id")
                    ):
                        return i
                if time.monotonic() > deadline:
                    msg = f"no etcd leader within {timeout}s; logs in {self.base_dir}:\n{self.logs()[-3000:]}"
                    raise TimeoutError(msg)
                time.sleep(0.1)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until a write through every running member succeeds."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client() as client:
            for i, process in enumerate(self.processes):
                while process is not None:
                    if process.poll() is not None:
                        msg = f"etcd member {self.names[i]} exited with code {process.returncode}:\n{self.logs()[-3000:]}"
                        raise RuntimeError(msg)
                    with contextlib.suppress(httpx.HTTPError):
                        r = client.post(
                            f"{self.endpoints[i]}/v3/kv/put",
                            json={"key": "cmVhZHk=", "value": ""},
                            timeout=3.0,
                        )
                        if r.status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        msg = f"etcd member {self.names[i]} not ready within {timeout}s:\n{self.logs()[-3000:]}"
                        raise TimeoutError(msg)
                    time.sleep(0.1)

    def kill(self, i: int) -> None:
        """kill -9 member ``i``."""
        process = self.processes[i]
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def restart(self, i: int) -> None:
        """Start member ``i`` again on its data directory (it rejoins the cluster)."""
        self.kill(i)
        self.start_member(i, state="existing")

    def logs(self) -> str:
        out = []
        for name in self.names:
            with contextlib.suppress(OSError):
                out.append(
                    f"--- {name}\n"
                    + (self.base_dir / f"{name}.log").read_text(errors="replace")[-1500:]
                )
        return "\n".join(out)

    def stop(self, timeout: float = 3.0) -> None:
        """Stop every member: SIGTERM, then SIGKILL after ``timeout`` seconds (a member that lost
        its peers may spend long trying to hand its leadership over)."""
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for i, process in enumerate(self.processes):
            if process is not None:
                try:
                    process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.kill(i)

    def __enter__(self) -> LocalEtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
