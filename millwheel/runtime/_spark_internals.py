"""Every use of Spark's internals, in one place (this module, ``_spark_protocol.py`` and
``_state_files.py``): what a PySpark upgrade can break.

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
  micro-batch execution sets for its jobs, ``foreachBatch``'s included); :func:`task_property`:
  any other (the Arrow mapping's batch plan, ``plans/arrow.py``).
* **the order sources are listed in** — :func:`sources_asked_in_plan_order`.
* **state-store files, and the providers that write them** — in ``_state_files.py``: the
  files' names per provider (dropping a version, grafting a store) and the private fields
  of Spark's ``StateStore`` object (releasing a stopped query's providers).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from typing import Any

import msgpack

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
    value = task_property("streaming.sql.batchId")
    return None if value is None else int(value)


def task_query_id() -> str | None:
    """The streaming query a running Spark task belongs to (``None``: none): the id its
    checkpoint keeps (``metadata``), the same across restarts of the query."""
    return task_property("sql.streaming.queryId")


def task_property(name: str) -> str | None:
    """A local property of the job the running Spark task belongs to (``None``: none, or not in a task)."""
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
