"""A Spark session for millwheel: this interpreter for the workers, sane local defaults."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_session(master: str = "local[2]", *, shuffle_partitions: int | None = None, app_name: str = "millwheel", conf: dict[str, str] | None = None) -> Any:
    """Get or create the session. ``PYSPARK_PYTHON`` is set to this interpreter (docs/runtime.md)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    if shuffle_partitions is None:
        shuffle_partitions = _cores(master)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.fileSource.log.compactInterval", "1000")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", os.environ.get("MILLWHEEL_DRIVER_MEMORY", "2g"))
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    level = os.environ.get("MILLWHEEL_SPARK_LOG_LEVEL", "ERROR")
    spark.sparkContext.setLogLevel(level)
    if level == "ERROR":
        _quiet_task_failures(spark)
    return spark


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
)


def _quiet_task_failures(spark: Any) -> None:
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name in _TASK_FAILURE_LOGGERS:
            configurator.setLevel(name, level)
    except Exception:  # noqa: S110 - only log noise is at stake
        pass


def _cores(master: str) -> int:
    if master.startswith("local["):
        inner = master[len("local["):-1].split(",")[0]
        if inner == "*":
            return os.cpu_count() or 2
        try:
            return int(inner)
        except ValueError:
            return 2
    return 8
