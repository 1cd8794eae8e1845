"""A throwaway PostgreSQL server for the database-sink test, and the sink's ``foreach_batch`` writer.

:func:`postgres` (a pytest fixture) runs ``initdb`` and ``postgres`` from Debian's
``postgresql`` package (``scripts/setup.sh --test`` installs it) in a temporary directory,
on loopback and a free port, as the ``postgres`` user when the tests run as root
(PostgreSQL refuses to run as root), and yields its DSN; the test is skipped with the
reason when the server or ``psycopg`` is missing. :func:`postgres_server` yields the server
itself (:class:`PostgresServer`: its ``dsn``, and ``restart(down_s)``, a restart in the
middle of a run).

:func:`upsert_counts` is what a user writes for a database sink: a ``foreach_batch``
function that upserts each row on its production id, in one transaction per batch, so a
batch written again after a crash changes nothing. It also appends every row it is given
to ``deliveries`` (batch number, id, value), which the test reads to show the re-deliveries
and that a re-delivered id always carried the same value.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

SCHEMA = """
CREATE TABLE IF NOT EXISTS counts (id text PRIMARY KEY, key text NOT NULL, second bigint NOT NULL, count bigint NOT NULL, batch_id bigint NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (batch_id bigint NOT NULL, id text NOT NULL, value text NOT NULL);
"""


def server_binaries() -> tuple[str, str] | None:
    """``(initdb, postgres)`` from ``PATH`` or Debian's ``/usr/lib/postgresql/<version>/bin``."""
    initdb, server = shutil.which("initdb"), shutil.which("postgres")
    if initdb and server:
        return initdb, server
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(f"{bindir}/initdb") and os.path.exists(f"{bindir}/postgres"):
            return f"{bindir}/initdb", f"{bindir}/postgres"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A running throwaway server: its ``dsn``; :meth:`restart` stops it (a fast shutdown: clients are
    cut off) and starts it again on the same data and port after ``down_s`` seconds."""

    def __init__(
        self, psycopg, server: str, data: str, base: str, port: int, user: str | None, log
    ) -> None:
        self.psycopg, self.server, self.data, self.base, self.port, self.user, self.log = (
            psycopg,
            server,
            data,
            base,
            port,
            user,
            log,
        )
        self.dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5"
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.server,
                "-D",
                self.data,
                "-p",
                str(self.port),
                "-k",
                self.base,
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
            ],
            user=self.user,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with self.psycopg.connect(self.dsn) as conn:
                    conn.execute(SCHEMA)
                return
            except self.psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.log.flush()
                    with open(
                        os.path.join(self.base, "server.log"), encoding="utf-8", errors="replace"
                    ) as f:
                        pytest.fail(f"PostgreSQL did not start: {f.read()[-2000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)  # fast shutdown: open connections are cut
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this test (``tests/runtime/pg.py``), which the test may restart."""
    psycopg = pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install -e '.[test]')"
    )
    found = server_binaries()
    if found is None:
        pytest.skip(
            "PostgreSQL's server is not installed (scripts/setup.sh --test installs Debian's postgresql)"
        )
    initdb, server = found
    as_root = os.geteuid() == 0
    user = "postgres" if as_root else None
    if as_root:
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip(
                "running as root and there is no 'postgres' user to run the server as (PostgreSQL refuses root)"
            )
    base = tempfile.mkdtemp(prefix="millwheel-pg-")
    data = os.path.join(base, "data")
    if as_root:
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    log = open(os.path.join(base, "server.log"), "ab")  # noqa: SIM115
    pg = PostgresServer(psycopg, server, data, base, _free_port(), user, log)
    try:
        subprocess.run(
            [initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            user=user,
            check=True,
            capture_output=True,
        )
        pg.start()
        yield pg
    finally:
        pg.stop()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres(postgres_server) -> str:
    """A PostgreSQL server for this test: its DSN (``tests/runtime/pg.py``)."""
    return postgres_server.dsn


def upsert_counts(dsn: str):
    """A ``SparkSink(foreach_batch=...)`` writer: upsert each count on its production id."""

    def write(df, batch_id: int) -> None:
        import json

        import psycopg

        rows = df.toArrow().to_pylist()
        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO deliveries (batch_id, id, value) VALUES (%s, %s, %s)",
                [(batch_id, r["id"], r["value"]) for r in rows],
            )
            cur.executemany(
                "INSERT INTO counts (id, key, second, count, batch_id) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, second = EXCLUDED.second, count = EXCLUDED.count, batch_id = EXCLUDED.batch_id",
                [
                    (
                        r["id"],
                        (v := json.loads(r["value"]))["key"],
                        v["second"],
                        v["count"],
                        batch_id,
                    )
                    for r in rows
                ],
            )

    return write


def table(dsn: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return list(conn.execute(sql).fetchall())
