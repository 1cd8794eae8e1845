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
    spark.sparkContext.setLogLevel(os.environ.get("MILLWHEEL_SPARK_LOG_LEVEL", "ERROR"))
    return spark


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
