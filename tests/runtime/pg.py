"""A throwaway PostgreSQL server for the database-sink test, and the sink's ``foreach_batch`` writer.

:func:`postgres` (a pytest fixture) runs ``initdb`` and ``postgres`` from Debian's
``postgresql`` package (``scripts/setup.sh --test`` installs it) in a temporary directory,
on loopback and a free port, as the ``postgres`` user when the tests run as root
(PostgreSQL refuses to run as root), and yields its DSN; the test is skipped with the
reason when the server or ``psycopg`` is missing.

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


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL server for this test: its DSN (``tests/runtime/pg.py``)."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    found = server_binaries()
    if found is None:
        pytest.skip("PostgreSQL's server is not installed (scripts/setup.sh --test installs Debian's postgresql)")
    initdb, server = found
    as_root = os.geteuid() == 0
    user = "postgres" if as_root else None
    if as_root:
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as (PostgreSQL refuses root)")
    base = tempfile.mkdtemp(prefix="millwheel-pg-")
    data = os.path.join(base, "data")
    if as_root:
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    port = _free_port()
    log = open(os.path.join(base, "server.log"), "ab")  # noqa: SIM115
    proc = None
    try:
        subprocess.run([initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"], user=user, check=True, capture_output=True)
        proc = subprocess.Popen(
            [server, "-D", data, "-p", str(port), "-k", base, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            user=user, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5"
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(dsn) as conn:
                    conn.execute(SCHEMA)
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    with open(os.path.join(base, "server.log"), encoding="utf-8", errors="replace") as f:
                        pytest.fail(f"PostgreSQL did not start: {f.read()[-2000:]}")
                time.sleep(0.2)
        yield dsn
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def upsert_counts(dsn: str):
    """A ``SparkSink(foreach_batch=...)`` writer: upsert each count on its production id."""

    def write(df, batch_id: int) -> None:
        import json

        import psycopg

        rows = df.toArrow().to_pylist()
        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            cur.executemany("INSERT INTO deliveries (batch_id, id, value) VALUES (%s, %s, %s)", [(batch_id, r["id"], r["value"]) for r in rows])
            cur.executemany(
                "INSERT INTO counts (id, key, second, count, batch_id) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, second = EXCLUDED.second, count = EXCLUDED.count, batch_id = EXCLUDED.batch_id",
                [(r["id"], (v := json.loads(r["value"]))["key"], v["second"], v["count"], batch_id) for r in rows],
            )  # fmt: skip

    return write


def table(dsn: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return list(conn.execute(sql).fetchall())
