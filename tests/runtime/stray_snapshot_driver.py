"""A process of its own for ``test_spark_internals.py``: does a stopped query's state store
write into its state directory after the stop? (``_state_files.release_state_stores``)

    python tests/runtime/stray_snapshot_driver.py {release|keep} DIR

Runs a small RocksDB-backed aggregation (changelog checkpointing, a snapshot queued at
every commit, maintenance every second) to its end, then, with ``release``, releases its
providers; moves the state directory aside and puts an empty one in its place, as a layout
change's swap does; watches the new directory for maintenance ticks (until a snapshot
appears, or 10 s if released) and prints the files that appeared in it as JSON on its
last line. Its own session: the maintenance interval is
fixed when a JVM's first stateful query starts.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from millwheel.runtime._fs import Location
from millwheel.runtime._state_files import release_state_stores


def count(spark: SparkSession, data: Path, checkpoint: Path) -> None:
    """A stateful query (a count per ``k``) over the parquet files in ``data``, a file per
    batch, run to its end: a committed store version per batch, and providers left loaded."""
    q = (
        spark.readStream.schema("k long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(data))
        .groupBy("k")
        .count()
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)


def main() -> int:
    release, base = sys.argv[1] == "release", Path(sys.argv[2])
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1")
        .getOrCreate()
    )
    data, checkpoint = base / "in", base / "checkpoint"
    data.mkdir(parents=True)
    for i in range(4):
        pd.DataFrame({"k": [1, 2, 3, i]}).to_parquet(data / f"{i}.parquet")
    count(spark, data, checkpoint)
    state = checkpoint / "state"
    if release:
        release_state_stores(spark, Location.of(str(state)))
    shutil.move(str(state), str(base / "aside"))
    state.mkdir()
    # maintenance ticks every second: kept, the old store's snapshot shows within a few (on a
    # loaded machine, later: up to 60 s); released, nothing may come in 10 s
    deadline = time.monotonic() + (10 if release else 60)
    written: list[str] = []
    while time.monotonic() < deadline and not any(n.endswith(".zip") for n in written):
        time.sleep(0.5)
        written = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    print(json.dumps(written))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
