"""A process of its own for ``test_spark_internals.py``: does a stopped query's state store
write into its state directory after the stop? (``_state_files.release_state_stores``)

    python tests/runtime/stray_snapshot_driver.py {release|keep} DIR

Runs a small RocksDB-backed aggregation (changelog checkpointing, a snapshot queued at
every commit, maintenance every second) to its end, then, with ``release``, releases its
providers; moves the state directory aside and puts an empty one in its place, as a layout
change's swap does; watches the new directory for maintenance ticks (until a snapshot
appears, 30 s; 10 s if released) and prints the files that appeared in it as JSON on its
last line. Again in a fresh directory (up to 5 attempts) if maintenance had uploaded every
snapshot before the swap, so nothing was left to write, or, kept, if none showed: on a
loaded machine maintenance may race the swap itself. Its own session: the maintenance
interval is fixed when a JVM's first stateful query starts.
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


def queued(store: Path) -> bool:
    """Whether some partition of ``store`` lacks the snapshot of its last version: a
    snapshot the provider has queued and maintenance has not uploaded yet."""
    for part in (p for p in store.glob("*/*") if p.name.isdigit()):
        versions = [int(c.stem) for c in part.glob("*.changelog")]
        if versions and not (part / f"{max(versions)}.zip").exists():
            return True
    return False


def watch(state: Path, seconds: float) -> list[str]:
    """The files that appear in ``state`` within ``seconds`` (maintenance ticks every
    second; on a loaded machine later), until a snapshot does."""
    deadline = time.monotonic() + seconds
    written: list[str] = []
    while time.monotonic() < deadline and not any(n.endswith(".zip") for n in written):
        time.sleep(0.5)
        written = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    return written


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
    # the scenario needs a snapshot still queued when the directory is swapped: maintenance
    # may have uploaded the last one already (a loaded machine, a slow stop); and kept, its
    # upload may still miss the watch (maintenance racing the swap itself). Each attempt in
    # a fresh directory: kept, until a snapshot shows; released, until one attempt had a
    # snapshot queued (none may show)
    written: list[str] = []
    watched = 0
    for attempt in range(5):
        run = base / str(attempt)
        data, checkpoint = run / "in", run / "checkpoint"
        data.mkdir(parents=True)
        for i in range(4):
            pd.DataFrame({"k": [1, 2, 3, i]}).to_parquet(data / f"{i}.parquet")
        count(spark, data, checkpoint)
        state = checkpoint / "state"
        pending = queued(state)  # before the release, which uploads it
        if release:
            release_state_stores(spark, Location.of(str(state)))
        shutil.move(str(state), str(run / "aside"))
        state.mkdir()
        if not (pending and (release or queued(run / "aside"))):
            print(
                f"attempt {attempt}: every snapshot was uploaded before the swap", file=sys.stderr
            )
            continue
        watched += 1
        written = watch(state, 10 if release else 30)
        if release or any(n.endswith(".zip") for n in written):
            break
        print(f"attempt {attempt}: no snapshot showed in 30 s", file=sys.stderr)
    if not watched:
        print("no attempt left a snapshot queued at the swap", file=sys.stderr)
        return 1
    print(json.dumps(written))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
