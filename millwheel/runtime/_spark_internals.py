"""Every use of Spark's internals, in one module: what a PySpark upgrade can break.

millwheel runs on public Spark APIs (``applyInPandasWithState``, ``transformWithStateInPandas``,
file sources and sinks, ``foreachBatch``, the state data sources), and depends, beyond
them, on the things below. Each has a contract test in
``tests/runtime/test_spark_internals.py`` named after it, so an upgrade that changes one
fails in that test, not somewhere in a run:

* **the version** — :data:`SUPPORTED_PYSPARK`: the range these contracts were checked on;
  :func:`check_pyspark_version` refuses another with what to do (the session calls it).
* **the state server's socket protocol** — :class:`MapStatePipeline` (``_spark_protocol.py``,
  re-exported here) speaks it through private attributes of PySpark's ``MapState``
  (``_mapStateClient``, ``_stateful_processor_api_client``, ``_stateName``,
  ``_receive_proto_message``, ``_serialize_to_bytes``) to pipeline many keys' reads and
  writes per round trip.
* **the state data sources' columns** — :func:`read_envelopes` (``state-metadata``'s
  ``operatorName``; ``statestore``'s ``value.groupState.envs``, ``user_map_key.key``,
  ``user_map_value.env``).
* **the checkpoint's file formats** — :func:`committed_batches` (``commits/<n>``),
  :func:`planned_batches`, :func:`offset_log_metadata` and :func:`offset_log_entries`
  (``offsets/<n>``: a version line, the batch's metadata, one line per source), :func:`source_log_files` (a file source's ``sources/<i>/<n>``: a
  version line, one JSON line per file), :func:`interval_state_timeouts` (the interval-row
  operator's schema file, ``state/0/0/_metadata/schema``).
* **the text of errors** — Spark passes a Python worker's exception to the driver as
  text inside a Java exception: :func:`python_error` (the traceback in it),
  :func:`error_mentions` (a marker of ours in it), :func:`is_transient` (a lost worker),
  :func:`disk_full`, :func:`compact_interruption` (a stop, and a workaround for how
  Spark 4.3 recognises one).
* **the JVM's log4j** — :func:`root_log_level`, :func:`silence_loggers` through ``_jvm``.
* **an internal setting and property** — :func:`polling_delay_conf`: how long an idle query
  sleeps between two polls of its sources (``spark.sql.streaming.pollingDelay``, internal in
  Spark's ``SQLConf``); :func:`task_batch_id` and :func:`task_query_id`: a task's micro-batch
  and query (``streaming.sql.batchId``, ``sql.streaming.queryId``: local properties Spark's
  micro-batch execution sets for its jobs, ``foreachBatch``'s included).
* **the order sources are listed in** — :func:`sources_asked_in_plan_order`.
* **the state stores a JVM keeps loaded** — :func:`release_state_stores` reads the private
  ``loadedProviders``, ``unloadedProvidersToClose``, ``snapshotPartitions`` and
  ``cleanupPartitions`` of Spark's ``StateStore`` object by reflection and calls its
  ``doMaintenanceAndUnload`` and ``closeProvider``.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import pyarrow.fs as pafs

from millwheel._errors import EnvelopeError, RunError
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_protocol import MapStatePipeline as MapStatePipeline

_unpackb = msgpack.unpackb

#: the PySpark versions the contracts below were checked on: ``[low, high)``
SUPPORTED_PYSPARK = ("4.3.0", "4.4.0")


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        out.append(int(digits))
    return tuple(out)


def check_pyspark_version(version: str | None = None) -> str:
    """The installed PySpark's version (or ``version``), if it is in :data:`SUPPORTED_PYSPARK`;
    otherwise :class:`RunError` with the range and what to do.

    >>> check_pyspark_version("4.3.0")
    '4.3.0'
    >>> check_pyspark_version("4.4.1")
    Traceback (most recent call last):
    ...
    millwheel._errors.RunError: PySpark 4.4.1 is not supported: millwheel uses Spark internals (millwheel/runtime/_spark_internals.py) checked on >=4.3.0,<4.4.0; install the pinned version (pip install -e .), or run tests/runtime/test_spark_internals.py on this one and widen SUPPORTED_PYSPARK if it passes
    """
    if version is None:
        import pyspark

        version = pyspark.__version__
    low, high = SUPPORTED_PYSPARK
    if not _version_tuple(low) <= _version_tuple(version) < _version_tuple(high):
        msg = (
            f"PySpark {version} is not supported: millwheel uses Spark internals (millwheel/runtime/_spark_internals.py) "
            f"checked on >={low},<{high}; install the pinned version (pip install -e .), or run "
            "tests/runtime/test_spark_internals.py on this one and widen SUPPORTED_PYSPARK if it passes"
        )
        raise RunError(msg)
    return version


# ---- the state data sources -------------------------------------------------------------------
def read_envelopes(
    spark: Any, checkpoint_uri: str, batch_id: int | None = None
) -> dict[bytes, bytes]:
    """Every key's committed envelope (key bytes -> envelope), in either state layout.

    Read-only, through Spark's state data sources: the query's operator (state metadata)
    says the layout; interval rows are unpacked, per-key rows read as they are.
    """
    meta = spark.read.format("state-metadata").load(checkpoint_uri).select("operatorName").collect()
    per_key = any("transformWithState" in row[0] for row in meta)
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    if per_key:
        df = reader.option("stateVarName", "envs").load(checkpoint_uri)
        return {
            row[0]: row[1] for row in df.select("user_map_key.key", "user_map_value.env").collect()
        }
    out: dict[bytes, bytes] = {}
    for row in (
        reader.load(checkpoint_uri)
        .select("value.groupState.envs", "value.groupState.meta")
        .collect()
    ):
        if (
            row[0] is not None and not row[1]
        ):  # the per-record layout always packs a meta map; a columnar store leaves it empty
            msg = (
                f"the state in {checkpoint_uri} is a columnar computation's stores (one per key interval), not envelopes: "
                "read it with SparkRuntime.states() or millwheel state"
            )
            raise EnvelopeError(msg)
        if row[0] is not None:
            out.update(_unpackb(row[0], raw=False, strict_map_key=False))
    return out


def read_interval_states(
    spark: Any, checkpoint_uri: str, batch_id: int
) -> tuple[str, dict[int, Any]]:
    """``(what, {Spark group: state})`` as of committed batch ``batch_id``, by the group value
    that keys each interval row (the ``statestore`` source's ``key`` struct holds the
    grouping column). ``what`` is ``"envelopes"`` (a per-record computation's interval rows:
    ``{key bytes: envelope}`` per group), ``"columnar"`` (a columnar computation's: its
    store blob per group, ``millwheel/_colstore.py``) or ``"keys"`` (the per-key layout; the
    map is empty: a rescale refuses it, ``_rescale.py``)."""
    meta = spark.read.format("state-metadata").load(checkpoint_uri).select("operatorName").collect()
    if any("transformWithState" in row[0] for row in meta):
        return "keys", {}
    out: dict[int, Any] = {}
    kinds = set()
    df = spark.read.format("statestore").option("batchId", batch_id).load(checkpoint_uri)
    for row in df.select("key", "value.groupState.envs", "value.groupState.meta").collect():
        group = int(row[0][0])
        if not row[
            2
        ]:  # the per-record layout always packs a meta map; a columnar store leaves it empty
            kinds.add("columnar")
            out[group] = row[1]
        else:
            kinds.add("envelopes")
            out[group] = {} if row[1] is None else _unpackb(row[1], raw=False, strict_map_key=False)
    if len(kinds) > 1:
        msg = f"the state in {checkpoint_uri} mixes a columnar computation's stores and per-record envelopes: it is damaged"
        raise EnvelopeError(msg)
    return kinds.pop() if kinds else "envelopes", out


# ---- the checkpoint's file formats ------------------------------------------------------------
#: the directories of a streaming query's checkpoint
COMMITS, OFFSETS, SOURCES, STATE = "commits", "offsets", "sources", "state"


def committed_batches(checkpoint: Location) -> list[int]:
    """The batches a query's commit log says are committed (``commits/<n>``), ascending."""
    out = []
    for name in checkpoint.child(COMMITS).list():
        if name.isdigit():
            out.append(int(name))
    return sorted(out)


def drop_planned_batch(checkpoint: Location, batch: int) -> list[str]:
    """Forget batch ``batch``, planned and never committed: its offset-log entry (with the
    checksum file beside it) and every state-store file of the version it would have
    committed (``state/<operator>/<partition>/<batch + 1>.delta`` and the like); returns the
    state files deleted. The query's next start plans the batch anew from the last
    committed one, over the file sources' logs (which keep every file they listed, so the
    new plan reads them all). Only ``_rescale.py`` does this, under its checks.

    The state files matter: a task of the dropped attempt may have finished and written
    its partition's next version; Spark expects a re-run of a batch to be the *same* batch,
    and when it finds that file already there it keeps it (the checkpoint file managers
    rename without overwriting). A batch planned anew is not the same batch, so a kept
    file would be another batch's state.
    """
    # the state files first: killed in between, the offset-log entry is still there and the
    # next start replays the *same* batch, which writes them again; the other way round, it
    # would plan a new batch and keep the files of the dropped one
    dropped = _drop_state_version(checkpoint.child(STATE), batch + 1)
    offsets = checkpoint.child(OFFSETS)
    for name in (str(batch), f".{batch}.crc"):
        offsets.child(name).delete()
    return dropped


_STATE_FILE_KINDS = (".delta", ".snapshot", ".changelog", ".zip")


def drop_uncommitted_state(checkpoint: Location) -> list[str]:
    """Delete every state-store file of a version no committed batch made (above the last
    committed batch + 1); returns the files deleted. Every computation query calls it before
    it starts (``_query.py``), so a replayed batch is the only writer of its version.

    Without it, a killed attempt's state outlives its replay. A task commits its
    state-store version at its end, before Spark's commit log. Spark takes a replay to be
    the *same* batch: when the version's file is already there it keeps it rather than
    rename its own over it (the checkpoint file managers rename without overwriting), and
    the store's maintenance thread may have snapshotted it too (the HDFS-backed provider
    snapshots the newest version it holds; RocksDB uploads ``<version>.zip``). For a
    computation that draws random numbers or reads the clock, the replay is another batch:
    every later load of that version — a restart, ``millwheel state`` — would give the
    killed attempt's state, not the one committed with the published productions
    (MillWheel §6.1.2). Spark's own answer, checkpoint ids per attempt
    (``checkpointFormatVersion`` 2), is for the RocksDB provider only.
    ``tests/runtime/test_strong_productions.py`` has the kill that shows it.
    """
    last = max(committed_batches(checkpoint), default=-1)
    return _drop_state_versions(checkpoint.child(STATE), lambda v: v > last + 1)


def _drop_state_version(loc: Location, version: int) -> list[str]:
    """Delete the state-store files of ``version`` under ``loc`` (every operator, partition
    and store; their checksums and temporary files too)."""
    return _drop_state_versions(loc, lambda v: v == version)


def _state_file_version(name: str) -> int | None:
    """The version a state-store file is of (``12.delta``, ``.12.delta.crc``, ``12_<id>.zip``,
    ``12.changelog``...), or ``None`` for any other file."""
    bare = name.lstrip(".")
    head = bare.split(".", 1)[0].split("_", 1)[0]
    return int(head) if head.isdigit() and any(k in bare for k in _STATE_FILE_KINDS) else None


def _drop_state_versions(loc: Location, drop: Callable[[int], bool]) -> list[str]:
    dropped: list[str] = []
    if not loc.exists():
        return dropped
    for name in loc.list():
        if name == "_metadata":
            continue
        child = loc.child(name)
        version = _state_file_version(name)
        if version is not None:
            if drop(version):
                child.delete()
                dropped.append(child.uri)
        elif (
            not name.startswith(".")
            and "." not in name
            and loc.fs.get_file_info(child.path).type == pafs.FileType.Directory
        ):
            # an operator, partition or store directory (not a file without a dot in its name,
            # as transformWithState's schema files ``_stateSchema/default/<batch>_<uuid>`` are)
            dropped += _drop_state_versions(child, drop)
    return dropped


_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.StateStore$"


def release_state_stores(spark: Any, state: Location, timeout_s: float = 60.0) -> int:
    """Run the pending maintenance of, and close, every state-store provider this JVM still
    holds for a store under ``state`` (a stopped query's ``<checkpoint>/state``, every run
    of it); returns how many. Call it once the query stopped and its jobs are gone
    (``_session.wait_for_jobs``), *before* changing the store's files.

    A stopped query's providers stay loaded. Spark runs their maintenance later — at its
    next round, or at once when a new run's provider of the same store reports active —
    and only then closes them: a RocksDB provider uploads its queued snapshot
    ``<version>.zip``, an HDFS-backed one writes ``<version>.snapshot``, by path. A store
    changed in between (a layout change's swap puts a new store at that path; a restart
    drops a killed attempt's version) then gets an old store's file: a snapshot that
    replaces the new store's base or a dropped attempt's version, and a later load reads
    the old keys and timers (a CI fault campaign saw windows fired twice after an online
    ``keys -> keys`` rescale). Run here, that maintenance writes before the change, which
    then drops or moves aside what it wrote.

    Providers live in the JVM that ran the tasks: the driver's own in local mode. With
    executors elsewhere (``spark://``) this finds none (``docs/runtime.md``, "Known limits").
    """
    if spark is None:
        return 0
    jvm = spark.sparkContext._jvm
    cls = jvm.java.lang.Class.forName(_STATE_STORE)
    store = cls.getField("MODULE$").get(None)

    def private(name: str) -> Any:
        field = cls.getDeclaredField(name)
        field.setAccessible(True)
        return field.get(store)

    want = state.path.rstrip("/")

    def ours(provider_id: Any) -> bool:
        root = str(provider_id.storeId().checkpointRootLocation())
        path = urllib.parse.urlparse(root).path if ":" in root else root
        return path.rstrip("/") == want

    def in_flight(ids: list[Any]) -> bool:
        busy = [private("snapshotPartitions"), private("cleanupPartitions")]
        return any(b.contains(i) for b in busy for i in ids)

    deadline = time.monotonic() + timeout_s
    loaded = private("loadedProviders")
    keys = jvm.java.util.ArrayList(
        jvm.scala.jdk.javaapi.CollectionConverters.asJava(loaded.keySet())
    )
    ids = [i for i in keys if ours(i)]
    queued = [e for e in list(private("unloadedProvidersToClose").toArray()) if ours(e._1())]
    everyone = ids + [e._1() for e in queued]
    while everyone and in_flight(everyone) and time.monotonic() < deadline:
        time.sleep(0.05)  # the pool's maintenance of one of them: let it finish first
    # a provider whose maintenance fails (a killed attempt's) is unloaded all the same: it
    # leaves ``loadedProviders`` (or the queue) first, and nothing runs its maintenance again
    for provider_id in ids:
        with contextlib.suppress(Exception):
            store.doMaintenanceAndUnload(provider_id)
    queue = private("unloadedProvidersToClose")
    for entry in queued:
        if queue.remove(entry):  # else the pool took it meanwhile: waited for below
            with contextlib.suppress(Exception):
                entry._2().doMaintenance()
            with contextlib.suppress(Exception):
                store.closeProvider(entry._1(), entry._2())
    while everyone and in_flight(everyone) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(everyone)


def graft_state(
    scratch: Location, staging: Location, version: int, final: Location | None = None
) -> int:
    """Copy the state a scratch query committed as its version 1 (the ``state/`` directory of
    its checkpoint, ``scratch``) into ``staging`` as version ``version``; returns the files copied.

    A store's version is only in its files' names: the RocksDB provider's snapshot
    ``1.zip`` (with changelog checkpointing off, each commit writes one; it names the SST
    files beside it, copied as they are) becomes ``<version>.zip``, and the HDFS-backed
    provider's first delta ``1.delta`` — every entry of it a put, the format of a snapshot —
    becomes ``<version>.snapshot``. Either loads alone, without the versions before it.
    The operator's metadata (``_metadata/``: ``transformWithState``'s names its state
    schema files by their full path) is copied with ``scratch``'s path replaced by
    ``final``'s, where the store will live (and without its checksum file). Other files are
    copied as they are; checksum files of renamed files are left out. Only ``_relayout.py``
    does this (docs/runtime.md, "Changing a computation's state layout").
    """
    return _graft(
        scratch, staging, version, (scratch.path, (final or staging).path), in_metadata=False
    )


def _graft(
    scratch: Location, staging: Location, version: int, paths: tuple[str, str], in_metadata: bool
) -> int:
    staging.mkdirs()
    copied = 0
    for name in scratch.list():
        src, dst = scratch.child(name), staging.child(name)
        bare = name.lstrip(".")
        if scratch.fs.get_file_info(src.path).type == pafs.FileType.Directory:
            copied += _graft(src, dst, version, paths, in_metadata or name == "_metadata")
            continue
        if (bare.startswith("1.") or in_metadata) and bare.endswith(".crc"):
            continue  # the checksum of a file renamed or rewritten below: a stale one would fail the read
        if in_metadata:
            with scratch.fs.open_input_stream(src.path) as f:
                text = f.read()
            with staging.fs.open_output_stream(dst.path) as f:
                f.write(text.replace(paths[0].encode(), paths[1].encode()))
            copied += 1
            continue
        if name == "1.zip":
            dst = staging.child(f"{version}.zip")
        elif name == "1.delta":
            dst = staging.child(f"{version}.snapshot")
        elif name.startswith("1.") and any(name.endswith(k) for k in _STATE_FILE_KINDS):
            msg = f"state file {src.uri} of the scratch query is of no kind a graft knows (1.zip, 1.delta)"
            raise RunError(msg)
        scratch.fs.copy_file(src.path, dst.path)
        copied += 1
    return copied


def set_offset_log_conf(checkpoint: Location, batch: int, conf: dict[str, str]) -> None:
    """Set ``conf`` in the session configuration batch ``batch``'s offset-log entry recorded
    (what a restarted query plans with: the state store provider, for one), and drop the
    entry's checksum file (the local filesystem checks it on read, and it is of the old text)."""
    entry = checkpoint.child(OFFSETS, str(batch))
    lines = (entry.read_text() or "").split("\n")
    meta = offset_log_metadata("\n".join(lines))
    if meta is None:
        msg = f"{entry.uri} is not an offset-log entry Spark wrote (no metadata line)"
        raise RunError(msg)
    meta["conf"] = {**(meta.get("conf") or {}), **conf}
    lines[1] = json.dumps(meta, separators=(",", ":"))
    checkpoint.child(OFFSETS, f".{batch}.crc").delete()
    entry.write_text("\n".join(lines))


def offset_log_conf(checkpoint: Location, batch: int) -> dict[str, str]:
    """The session configuration a batch's offset-log entry recorded (``spark.sql.shuffle.partitions``...)."""
    meta = offset_log_metadata(checkpoint.child(OFFSETS, str(batch)).read_text() or "")
    return dict((meta or {}).get("conf") or {})


def has_started(checkpoint: Location) -> bool:
    """Has the query of this checkpoint planned or committed a batch?"""
    return checkpoint.child(COMMITS).exists() or checkpoint.child(OFFSETS).exists()


def interval_state_timeouts(checkpoint: Location) -> bool | None:
    """Whether the interval rows in ``checkpoint``'s state carry ``applyInPandasWithState``'s
    timeout column, as a query with ``EventTimeTimeout`` writes them (``None``: no state
    schema yet). Spark records the operator's schema when it first plans it, in
    ``state/0/0/_metadata/schema`` (a version line, then the key and the value schema as
    JSON; the column is ``timeoutTimestamp``), and refuses to run the operator over it with
    another timeout setting (``plans/intervals.py``)."""
    schema = checkpoint.child("state", "0", "0", "_metadata", "schema")
    if not schema.exists():
        return None
    with schema.fs.open_input_stream(schema.path) as f:
        return b'"timeoutTimestamp"' in f.read()


def offset_log_entries(text: str) -> list[Any]:
    r"""The per-source entries of an offset-log file (``offsets/<n>``), in source order:
    the JSON of each source's offset (``None`` where a source has none: ``-``).

    Spark writes a version line (``v1``), the batch's metadata as JSON, then one line
    per source.

    >>> offset_log_entries('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}\n-\n{"lw": 5}')
    [{'logOffset': 3}, None, {'lw': 5}]
    """
    out: list[Any] = []
    for line in text.splitlines()[2:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(None)
    return out


def offset_log_metadata(text: str) -> dict[str, Any] | None:
    r"""The batch's metadata in an offset-log file (its second line: ``batchWatermarkMs``,
    ``batchTimestampMs``, the session conf), or ``None`` for a file still being written.

    >>> offset_log_metadata('v1\n{"batchWatermarkMs":1500,"batchTimestampMs":9}\n-')["batchWatermarkMs"]
    1500
    """
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return None
    try:
        meta = json.loads(lines[1])
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def planned_batches(checkpoint: Location) -> list[int]:
    """The batches a query's offset log says are planned (``offsets/<n>``), ascending."""
    return sorted(int(name) for name in checkpoint.child(OFFSETS).list() if name.isdigit())


def file_source_offsets(text: str) -> dict[int, int]:
    """Source index -> the log offset a batch read its file source up to, from an
    offset-log file (sources that are not file sources are left out)."""
    out = {}
    for i, entry in enumerate(offset_log_entries(text)):
        if isinstance(entry, dict) and "logOffset" in entry:
            try:
                out[i] = int(entry["logOffset"])
            except (TypeError, ValueError):
                continue
    return out


def task_batch_id() -> int | None:
    """The micro-batch a running Spark task belongs to (``None``: none)."""
    value = _task_property("streaming.sql.batchId")
    return None if value is None else int(value)


def task_query_id() -> str | None:
    """The streaming query a running Spark task belongs to (``None``: none): the id its
    checkpoint keeps (``metadata``), the same across restarts of the query."""
    return _task_property("sql.streaming.queryId")


def _task_property(name: str) -> str | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else ctx.getLocalProperty(name)


def source_log_files(text: str) -> list[tuple[list[str], int]] | None:
    """The files a file source's log entry (``sources/<i>/<n>``) added: each file's path,
    unquoted and split on ``/``, and its batch id; ``None`` if the entry is still being
    written (read it again later)."""
    out = []
    for line in text.splitlines()[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        out.append((urllib.parse.unquote(entry["path"]).split("/"), int(entry["batchId"])))
    return out


# ---- the text of errors -----------------------------------------------------------------------
#: what a lost worker or executor says (retry from the checkpoint), wherever Spark wrapped it
_TRANSIENT = (
    "Python worker exited unexpectedly",
    "Python worker failed to connect back",
    "CANNOT_OPEN_SOCKET",
    "SocketTimeoutException",
    "crashed",
    "EOFError",
    "Connection reset",
    "Broken pipe",
    "SparkOutOfMemoryError",
    "Executor lost",
    "ExecutorLostFailure",
)


def python_error(exc: Any) -> str:
    """The Python traceback inside a Spark exception (the last one), or its first line.

    Spark wraps it in Java exceptions and appends the query's plan; the traceback is
    what follows the last ``Traceback (most recent call last):`` up to and including the
    first line that is not indented (``SomeError: message``).
    """
    text = str(exc)
    at = text.rfind("Traceback (most recent call last):")
    if at >= 0:
        lines = text[at:].splitlines()
        out = [lines[0]]
        for line in lines[1:]:
            if not line.strip():
                continue
            out.append(line)
            if not line[0].isspace():
                break
        return "\n".join(out[-40:])
    first = text.strip().splitlines()[0] if text.strip() else repr(exc)
    return first[:500]


#: how a full disk reads in a Java or Python error, wherever Spark wrapped it
_DISK_FULL = ("No space left on device", "[Errno 28]")


def disk_full(exc: Any) -> str | None:
    """The line of ``exc``'s text (Java causes and Python tracebacks included) that says
    a write found the disk full, or ``None``."""
    for line in str(exc).splitlines():
        if any(marker in line for marker in _DISK_FULL):
            return line.strip().removeprefix("Caused by: ")[:300]
    return None


def is_transient(exc: Any) -> bool:
    """A lost worker or executor (retry from the checkpoint), not an error in the code."""
    return any(marker in str(exc) for marker in _TRANSIENT)


#: what a Java error says when a stopping query interrupts the job of its ``foreachBatch`` call
_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
    "cancelled part of cancelled job group",
    "cancelled because SparkContext was shut down",
    # a job the stop cancelled, as the driver-side outbox writer's collect reports it:
    # "[SPARK_JOB_CANCELLED] Job 9 cancelled Query millwheel.A [id = ..., runId = ...] was stopped"
    "] was stopped",
)


class QueryInterrupted(Exception):  # noqa: N818 - it is what happened, not an error of the user's
    """A ``foreachBatch`` call cut short by its query's stop (see :func:`compact_interruption`)."""


def compact_interruption(exc: BaseException) -> Exception | None:
    r"""The short form of an error that means "the query is being stopped", for a ``foreachBatch`` function.

    Spark 4.3 tells its own stop from a failure by matching the error's text against
    ``py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)(java.lang.InterruptedException|...)``
    (``StreamExecution.PROXY_ERROR``). ``java.util.regex`` recurses once per character on
    that group, so the Java stack trace a ``Py4JJavaError`` carries — thousands of
    characters — overflows the stream thread's stack, and the JVM prints ``Exception in
    thread "stream execution thread for ..." java.lang.StackOverflowError``. Raising the
    same error as one short line instead keeps the match (the stop is recognised and
    nothing is logged) and the stack small. Anything else: ``None``, raise it as it is.

    >>> class Py4JJavaError(Exception): ...
    >>> big = Py4JJavaError("An error occurred while calling o42.parquet.\n: java.lang.InterruptedException\n" + "\tat x\n" * 5000)
    >>> str(compact_interruption(big)).splitlines()
    ['py4j.protocol.Py4JJavaError: An error occurred while calling o42.parquet.', ': java.lang.InterruptedException (the query is stopping)']
    >>> collect = Py4JJavaError("An error occurred while calling o9.getResult.\n: org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
    ...     "Caused by: org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 9 cancelled Query millwheel.A [id = 1, runId = 2] was stopped SQLSTATE: XXKDA")
    >>> str(compact_interruption(collect)).splitlines()[-1]
    ': java.lang.InterruptedException (the query is stopping)'
    >>> compact_interruption(ValueError("java.lang.InterruptedException")) is None
    True
    """
    text = str(exc)
    if type(exc).__name__ != "Py4JJavaError" or not any(m in text for m in _INTERRUPTIONS):
        return None
    first = text.strip().split("\n", 1)[0].strip()
    return QueryInterrupted(
        f"py4j.protocol.Py4JJavaError: {first}\n: java.lang.InterruptedException (the query is stopping)"
    )


def polling_delay_conf(ms: int) -> dict[str, str]:
    """The setting that makes a query started with it (``_session.start_query``) sleep ``ms``
    between two polls of its sources that found no new data (Spark's default: 10 ms); read
    when the query is built, so it holds for that query only."""
    return {"spark.sql.streaming.pollingDelay": f"{int(ms)}ms"}


def sources_asked_in_plan_order(sources: int) -> bool:
    """Whether a query of ``sources`` sources asks them for new offsets (lists them) in the
    order of its plan whenever it plans a batch: Spark keeps them in an immutable ``Map``
    (``MicroBatchExecution.uniqueSources``), in insertion order up to four, hashed beyond."""
    return sources <= 4


def error_mentions(exc: Any, marker: str) -> bool:
    """Does a failed query's error carry ``marker`` (a message of ours a Python worker raised)?"""
    return marker in str(exc)


# ---- the JVM's log4j --------------------------------------------------------------------------
def root_log_level(spark: Any) -> str | None:
    """The driver JVM's root log level (``"ERROR"``, ...), or ``None`` if it cannot be read."""
    try:
        return str(
            spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()
        )
    except Exception:  # noqa: BLE001 - only log noise is at stake
        return None


def silence_loggers(spark: Any, names: Iterable[str]) -> bool:
    """Turn the JVM's loggers ``names`` off; ``False`` if the JVM's log4j cannot be reached."""
    try:
        jvm = spark.sparkContext._jvm
        off = jvm.org.apache.logging.log4j.Level.OFF
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name in names:
            configurator.setLevel(name, off)
    except Exception:  # noqa: BLE001 - only log noise is at stake
        return False
    return True
