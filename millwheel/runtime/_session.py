"""A Spark session for millwheel: this interpreter for the workers, sane defaults, a quiet log.

* **Workers run this interpreter** (``PYSPARK_PYTHON``, docs/runtime.md).
* **Loopback unless told otherwise.** For ``local[...]`` and a standalone master on this
  machine (``spark://127.0.0.1:...``, ``spark://localhost:...``) ``SPARK_LOCAL_IP`` defaults
  to ``127.0.0.1``: the driver, its block manager and the Spark UI listen on loopback only,
  and Spark does not warn that the host name resolves to a loopback address. Set
  ``SPARK_LOCAL_IP`` (or ``spark.driver.host``) to the address the cluster reaches the
  driver at when the workers are elsewhere.
* **The Spark UI** is off unless asked for (``ui=True``: ``millwheel run`` does, tests do
  not); :func:`ui_url` says where it is.
* **Known noise is quiet.** The driver JVM starts with a log4j2 configuration
  (:data:`LOG4J2_PROPERTIES`) at level ``$MILLWHEEL_SPARK_LOG_LEVEL`` (default ``ERROR``)
  from its first line, so the start-up warnings (host name, native Hadoop, "Setting
  default log level") never print; it also drops the AQE-in-streaming notices (AQE is off:
  streaming ignores it anyway) and a failed task's or query's whole Java trace (the
  runtime reports failures itself, with the Python traceback: ``_usercode.py``). Stopping
  queries logs nothing at the default level (:func:`quiet_while_stopping`), and a stop
  that interrupts a ``foreachBatch`` call no longer overflows the stream thread's stack
  (``_spark_internals.compact_interruption``).
* **Under spark-submit** the JVM, the master and the deploy mode are spark-submit's:
  :func:`under_spark_submit` tells, and the session takes them as given.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from millwheel.runtime import _cds as cds
from millwheel.runtime._settings import master_cores
from millwheel.runtime._spark_internals import (
    check_pyspark_version,
    root_log_level,
    silence_loggers,
)
from millwheel.runtime._worker_home import local_fs_conf, local_spark_home

#: loggers that print a failed task's or query's whole Java trace; the runtime reports the
#: failure itself, with the Python traceback (``_usercode.py``)
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.StreamExecution",
    "org.apache.spark.sql.execution.streaming.runtime.StreamExecution",
    "org.apache.spark.api.python.PythonRunner",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",
    "org.apache.spark.util.Utils",
)

#: loggers whose messages are known noise for a millwheel run, at any level
_NOISE_LOGGERS = (
    "org.apache.hadoop.util.NativeCodeLoader",  # "Unable to load native-hadoop library"
    "org.apache.spark.sql.catalyst.analysis.ResolveWriteToStream",  # "AQE is not supported in streaming"
)

LOG4J2_PROPERTIES = """\
# millwheel's log4j2 configuration for the driver JVM (millwheel/runtime/_session.py)
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
{loggers}
"""


def under_spark_submit() -> bool:
    """Is this interpreter the Python side of a ``spark-submit`` (the JVM already runs)?"""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def loopback_master(master: str | None) -> bool:
    """A master on this machine: ``local[...]`` or a standalone master on a loopback address."""
    if master is None:
        return False
    if master.startswith("local"):
        return True
    return master.startswith(("spark://127.0.0.1:", "spark://localhost:", "spark://[::1]:"))


def log4j2_file(level: str) -> str:
    """Write (once) the driver's log4j2 configuration for ``level``; returns its path."""
    # PySpark's gateway logs as a shell: unless its logger is configured at the root's level,
    # Spark prints "Setting default log level to WARN" and lets WARN through
    loggers = [
        "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer",
        f"logger.repl.level = {level.lower()}",
    ]
    for i, name in enumerate(_NOISE_LOGGERS):
        loggers += [f"logger.noise{i}.name = {name}", f"logger.noise{i}.level = off"]
    if level.upper() in ("ERROR", "FATAL", "OFF"):
        for i, name in enumerate(_TASK_FAILURE_LOGGERS):
            loggers += [f"logger.task{i}.name = {name}", f"logger.task{i}.level = off"]
    text = LOG4J2_PROPERTIES.format(level=level.lower(), loggers="\n".join(loggers))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = os.path.join(
        tempfile.gettempdir(), f"millwheel-log4j2-{os.getuid()}-{digest}.properties"
    )
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


#: Spark's checkpoint file manager for checkpoints on a local disk (docs/runtime.md,
#: "Checkpoints on a local disk"): Hadoop's ``FileSystem`` API renames with one system
#: call, where the default ``FileContext`` one runs ``readlink`` as a child process of the
#: JVM for every file it renames (no native Hadoop library), ~30 per micro-batch
LOCAL_CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}


#: a query whose computation handles no timers runs no micro-batch only because the
#: watermark moved: such a batch has no data and fires no timer, yet costs a whole stateful
#: batch (``docs/runtime.md``, "No-data batches"). Read when a query starts (not pinned by
#: its checkpoint), so it is given to :func:`start_query`.
NO_DATA_BATCHES_OFF = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}


#: the warning filter of Spark's Python workers (``PYTHONWARNINGS`` syntax)
PYSPARK_WORKER_WARNINGS = (
    "ignore:The behavior of DataFrame concatenation with empty or all-NA entries:FutureWarning"
)


def set_conf(spark: Any, conf: dict[str, str]) -> dict[str, str | None]:
    """Set ``conf`` in the session; returns what to give :func:`restore_conf` to undo it."""
    session = spark.conf
    saved = {k: session.get(k, None) for k in conf}
    for k, v in conf.items():
        session.set(k, v)
    return saved


def restore_conf(spark: Any, saved: dict[str, str | None]) -> None:
    """Undo :func:`set_conf` (a key that was not set is unset)."""
    for k, v in saved.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def start_query(writer: Any, spark: Any, conf: dict[str, str]) -> Any:
    """Start a streaming query (``writer.start()``) with ``conf`` set for its start.

    A query keeps the session configuration of its start for what it plans (it runs on a
    clone of the session) and its checkpoint then pins what must not change (the state
    store provider), so these settings are set in the session for the start only and
    restored. Not for settings its sources read: Spark creates a query's sources on its
    stream thread after ``start()`` returns, from the session itself
    (:func:`checkpoint_conf` is set for the whole run, by the runtime). One start at a
    time: an online layout change starts its scratch query on a thread of its own
    (``_online.py``), and two interleaved set-and-restore would leave the session changed.
    """
    with _START_LOCK:
        saved = set_conf(spark, conf)
        try:
            return writer.start()
        finally:
            restore_conf(spark, saved)


_START_LOCK = threading.Lock()


def _warm(batches: Iterator[Any]) -> Iterator[Any]:
    import millwheel.runtime._interval  # noqa: F401 - what a step's worker imports: pandas, pyarrow, msgpack, millwheel

    # PySpark's reused worker calls gc.collect() after every task (pyspark/daemon.py), which
    # walks every object the process holds, its imports included (~90k objects, 20-50 ms of
    # CPU a task on 2 shared cores): what is held now stays for the worker's life, so the
    # collector is told to leave it alone (gc.freeze: no longer examined, still freed by
    # reference counting)
    gc.collect()
    gc.freeze()
    # hold the worker a moment, so the other tasks of the job start workers of their own
    # rather than take this one after it finished (one warm worker, the others cold)
    time.sleep(0.3)
    yield from batches


def warm_python_workers(spark: Any) -> None:
    """Start one Python worker per core before the queries start (one tiny job).

    With ``spark.python.worker.reuse`` the queries' tasks take these idle workers instead
    of starting their own, and the modules every step needs are already imported in them:
    otherwise a run's first micro-batches pay for both (docs/performance.md, "Latency")."""
    n = max(1, int(spark.sparkContext.defaultParallelism))
    spark.range(0, n, 1, n).mapInArrow(_warm, "id long").collect()


def checkpoint_conf(root: Any) -> dict[str, str]:
    """Session settings for a run whose checkpoints are under ``root`` (a ``Location``).

    Set for the whole run (``SparkRuntime.start`` to ``stop``): the offset and commit logs
    and the state stores take the checkpoint manager when a query starts, but the file
    sources' logs (``sources/<i>/``) take it when Spark creates the sources, on the
    query's thread after the start, and again when a failed query restarts."""
    return dict(LOCAL_CHECKPOINT_CONF) if root.local else {}


#: more options for the driver JVM this process starts (``-XX:...``), before millwheel's own
JAVA_OPTIONS_ENV = "MILLWHEEL_JAVA_OPTIONS"


_GC_OPTION = re.compile(r"(?<!\S)-XX:\+Use\w*GC(?!\S)")


def join_java_options(*parts: str | None) -> str:
    """JVM options in order, later ones winning: for most ``-XX`` flags the JVM takes the
    last itself, but two garbage collectors (``-XX:+UseSerialGC ... -XX:+UseG1GC``) stop it
    from starting ("conflicting collector combinations"), so a part that names a collector
    removes those of the parts before it. Each part is kept as written otherwise (quotes too).

    >>> join_java_options("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", "-XX:+UseG1GC -Xss4m")
    '-XX:TieredStopAtLevel=1 -XX:+UseG1GC -Xss4m'
    >>> join_java_options(None, "-XX:+UseSerialGC", "-Dx='a  b'")
    "-XX:+UseSerialGC -Dx='a  b'"
    """
    kept = [p.strip() for p in parts if p and p.strip()]
    for i, part in enumerate(kept):
        if any(_GC_OPTION.search(later) for later in kept[i + 1 :]):
            kept[i] = _GC_OPTION.sub("", part).strip()
    return " ".join(p for p in kept if p)


def spark_session(
    master: str | None = "local[2]",
    *,
    shuffle_partitions: int | None = None,
    app_name: str = "millwheel",
    conf: dict[str, str] | None = None,
    ui: bool = False,
    jvm_log: str | None = None,
) -> Any:
    """Get or create the session. ``PYSPARK_PYTHON`` is set to this interpreter (docs/runtime.md).

    ``master=None`` takes the master from spark-submit (or ``local[*]`` outside it).
    ``jvm_log``: a file for the driver JVM's standard error — its log, and whatever the
    Python processes it starts print (a worker that cannot connect back, ...) — instead of
    this process's (``millwheel run`` keeps the terminal for its own status).
    """
    check_pyspark_version()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    submitted = under_spark_submit()
    if master is None and not submitted:
        master = "local[*]"
    if loopback_master(master) and not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    home = None
    if master is not None and master.startswith("local") and not submitted:
        # a home the user set is kept (one this process set before is this one again)
        home = os.environ.get("SPARK_HOME") or local_spark_home()
        if home is not None:  # its Python workers import compiled PySpark (``_worker_home.py``)
            os.environ["SPARK_HOME"] = home
    if shuffle_partitions is None:
        shuffle_partitions = master_cores(master)
    level = os.environ.get("MILLWHEEL_SPARK_LOG_LEVEL", "ERROR").upper()
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "false",  # streaming ignores AQE; saying so is noise
        "spark.sql.streaming.fileSource.log.compactInterval": "1000",
        "spark.python.worker.reuse": "true",
        # how long the JVM waits for a Python worker or data-source runner to connect back
        # (default 15 s: missed on a loaded machine, which fails the query)
        "spark.python.authenticate.socketTimeout": "120s",
        "spark.driver.memory": os.environ.get("MILLWHEEL_DRIVER_MEMORY", "2g"),
        # PySpark's applyInPandasWithState worker pads its output with all-NA frames and
        # pandas 2.x warns about that on every group (PySpark's code, not millwheel's)
        "spark.executorEnv.PYTHONWARNINGS": PYSPARK_WORKER_WARNINGS,
        # its local file system sets permissions without a process each, if the home has it
        # (``_worker_home.py``: a home the user set has not)
        **local_fs_conf(home),
    }
    shared = ""
    if not submitted:  # the driver JVM starts here: it reads its log configuration at start
        java_options = f"-Dlog4j2.configurationFile=file:{log4j2_file(level)}"
        # more options for the driver JVM (docs/deployment.md, "Quiet Spark"); the test suite
        # gives its short runs a JVM that compiles less (tests/conftest.py)
        if os.environ.get(JAVA_OPTIONS_ENV, "").strip():
            java_options = f"{os.environ[JAVA_OPTIONS_ENV].strip()} {java_options}"
        shared = (
            cds.java_options()
        )  # Spark's classes mapped from the archive built at set-up (``_cds.py``)
        settings["spark.driver.extraJavaOptions"] = join_java_options(
            shared or None, (conf or {}).get("spark.driver.extraJavaOptions"), java_options
        )
    else:  # spark-submit's --conf and spark-defaults.conf win over these defaults; the JVM's memory is set
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the gateway spark-submit started: its conf is the JVM's
        given = {k for k, _ in SparkConf().getAll()}
        settings = {
            k: v for k, v in settings.items() if k not in given and k != "spark.driver.memory"
        }
    settings.update({k: v for k, v in (conf or {}).items() if k != "spark.driver.extraJavaOptions"})
    builder = SparkSession.builder.appName(app_name)
    if master is not None and not submitted:
        builder = builder.master(master)
    for k, v in settings.items():
        builder = builder.config(k, v)
    redirect = jvm_log if not submitted else None
    try:
        with _stderr_to(redirect):
            try:
                spark = builder.getOrCreate()
            except Exception:
                if submitted or not shared:
                    raise
                # a JVM that will not start with the archive (damaged on disk) starts without
                # it; if it then starts, the archive was the cause and is set aside
                options = settings["spark.driver.extraJavaOptions"].replace(shared, "").strip()
                spark = builder.config("spark.driver.extraJavaOptions", options).getOrCreate()
                cds.set_aside(shared)
    except Exception as exc:
        if redirect is None:
            raise
        from millwheel._errors import MillwheelError

        with open(redirect, encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        msg = f"Spark did not start ({type(exc).__name__}); its log {redirect} ends with:\n{tail}"
        raise MillwheelError(msg) from exc
    spark.sparkContext.setLogLevel(level)
    if level in ("ERROR", "FATAL", "OFF"):
        _quiet_task_failures(spark)
    _quiet_accumulator_eof(spark)
    return spark


def _quiet_accumulator_eof(spark: Any) -> None:
    """PySpark's accumulator server prints a whole traceback when the JVM closes its connection
    mid-update (``EOFError``, seen when a stop cancels tasks); millwheel uses no accumulators."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None or getattr(server, "_millwheel_quiet", False):
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], EOFError):
            return
        report(request, client_address)

    server.handle_error = handle_error
    server._millwheel_quiet = True


@contextlib.contextmanager
def quiet_while_stopping(spark: Any) -> Iterator[None]:
    """Nothing logged while queries stop, at the default level (``ERROR``): the errors of the
    jobs a stop cancels (``Aborting job``, ``Error in TaskCompletionListener``, a broadcast
    that failed to store) are the stop itself, not news. The level is restored afterwards."""
    if spark is None:
        yield
        return
    previous = None
    level = root_log_level(spark)
    if level == "ERROR":  # at WARN and below someone is looking: show them everything
        with contextlib.suppress(Exception):
            spark.sparkContext.setLogLevel("OFF")
            previous = level
    try:
        yield
    finally:
        if previous is not None:
            with contextlib.suppress(Exception):
                spark.sparkContext.setLogLevel(previous)


@contextlib.contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """File descriptor 2 is ``path`` while the block runs: a process started in it keeps it."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def ui_url(spark: Any) -> str | None:
    """The Spark UI's address, or ``None`` when it is off."""
    try:
        url = spark.sparkContext.uiWebUrl
    except Exception:  # noqa: BLE001 - the UI is a convenience
        return None
    return url or None


def _quiet_task_failures(spark: Any) -> None:
    """The same as the log4j2 file, for a JVM that started without it (spark-submit, a test's session)."""
    silence_loggers(spark, (*_TASK_FAILURE_LOGGERS, *_NOISE_LOGGERS))


def session_master(spark: Any) -> str | None:
    """The master of a session, or ``None`` for an object that is not one (a test's stand-in:
    building a runtime does not otherwise touch its session)."""
    context = getattr(spark, "sparkContext", None)
    return None if context is None else context.master


def wait_for_jobs(spark: Any, run_id: str | None, timeout_s: float = 60.0) -> None:
    """Until no Spark job of a stopped or failed query's run (its job group) has a stage
    running: a task of an interrupted batch must not write a state file after an online
    move read the state and dropped that batch's files (``_state_files.drop_planned_batch``),
    or after a restart dropped the files of uncommitted versions (``drop_uncommitted_state``)."""
    if run_id is None:
        return
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = False
        active = set(tracker.getActiveStageIds())
        for jid in tracker.getJobIdsForGroup(run_id):
            info = tracker.getJobInfo(jid)
            if info is not None and (info.status == "RUNNING" or active & set(info.stageIds)):
                busy = True
                break
        if not busy:
            return
        time.sleep(0.05)


def command_session() -> Any:
    """The local Spark session ``millwheel rescale`` reads and moves state with, as quiet as
    ``millwheel run``: the JVM's standard error (its start-up warnings, its log, what the
    Python workers print, e.g. the state reader's debug lines) goes to a file, not the terminal."""
    jvm_log = os.path.join(tempfile.gettempdir(), f"millwheel-rescale-{os.getuid()}.log")
    return spark_session("local[2]", app_name="millwheel-rescale", jvm_log=jvm_log)
