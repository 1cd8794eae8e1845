"""PyFlink's windowed count, one job per process (run by ``bench/peers_bench.py`` with the
peers' virtualenv, ``bench/peers/setup.sh``).

The records are the bench's input files as CSV (``id,ts,query``; PyFlink's package ships
no Parquet format), read by Flink's own filesystem connector with an event-time watermark
on ``ts``, on a local mini-cluster (``--parallelism`` slots), checkpointing every
``--checkpoint-ms`` in exactly-once mode to ``--checkpoint-dir``:

* ``table`` — the Table API's tumbling window: ``TUMBLE(... INTERVAL '10' SECOND)``,
  ``COUNT(*)`` per query and window (SQL, no user code);
* ``kpf`` — the DataStream API's ``KeyedProcessFunction`` (the API closest to MillWheel's
  computations): keyed by query and window, a ``ValueState`` count and an event-time timer
  at the window's end that emits the count and clears the state; Python per record;
* ``kpf_dedup`` — the same with a ``MapState`` of the record ids seen in the key's window:
  a record whose id was seen is dropped (a duplicate carries its original's timestamp, so
  it falls in the same key and window).

The counts go to Flink's filesystem sink as CSV part files, which a checkpoint commits
(the last one when the input ends); the job then reads them back for the bench's check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _job import WINDOW_MS, finish  # noqa: E402
from pyflink.common import Configuration, Row, Types  # noqa: E402
from pyflink.datastream import (  # noqa: E402
    CheckpointingMode,
    KeyedProcessFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor  # noqa: E402
from pyflink.table import StreamTableEnvironment  # noqa: E402


class WindowCount(KeyedProcessFunction):
    """Counts a (query, window) key's records; emits the count when the watermark passes
    the window's end; ``dedup``: drops a record whose id the key has seen."""

    def __init__(self, dedup: bool) -> None:
        self.dedup = dedup

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        if self.dedup:
            self.seen = ctx.get_map_state(
                MapStateDescriptor("seen", Types.STRING(), Types.BOOLEAN())
            )

    def process_element(self, row, ctx):  # noqa: ANN001, ANN201 - PyFlink's signature
        if self.dedup:
            if self.seen.contains(row[0]):
                return
            self.seen.put(row[0], True)
        n = self.count.value()
        if n is None:
            ctx.timer_service().register_event_time_timer(ctx.get_current_key()[1] + WINDOW_MS - 1)
            n = 0
        self.count.update(n + 1)

    def on_timer(self, timestamp, ctx):  # noqa: ANN001, ANN201 - PyFlink's signature
        query, w = ctx.get_current_key()
        yield Row(query, w, self.count.value())
        self.count.clear()
        if self.dedup:
            self.seen.clear()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=["table", "kpf", "kpf_dedup"], required=True)
    p.add_argument("--csv", required=True, help="directory of the input as CSV files (id,ts,query)")
    p.add_argument("--out", required=True)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--checkpoint-ms", type=int, default=1000)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--watermark-delay-ms", type=int, default=0)
    args = p.parse_args()

    conf = Configuration()
    conf.set_string("execution.checkpointing.dir", Path(args.checkpoint_dir).resolve().as_uri())
    conf.set_string("table.local-time-zone", "UTC")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(args.checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
    t_env = StreamTableEnvironment.create(env)
    t_env.execute_sql(f"""
        CREATE TABLE events (
            id STRING, ts BIGINT, query STRING,
            rt AS TO_TIMESTAMP_LTZ(ts, 3),
            WATERMARK FOR rt AS rt - INTERVAL '{args.watermark_delay_ms // 60_000}:{args.watermark_delay_ms % 60_000 / 1000:06.3f}' MINUTE TO SECOND
        ) WITH ('connector' = 'filesystem', 'path' = '{Path(args.csv).resolve().as_uri()}', 'format' = 'csv')
    """)
    # the counts go to Flink's filesystem sink (CSV part files, committed by the checkpoints,
    # the last one when the input ends): results collected through the Python client come
    # one py4j call a row, which took minutes for the 100k windows of the default input
    sink = Path(args.checkpoint_dir).resolve().parent / "counts"
    t_env.execute_sql(f"""
        CREATE TABLE counts (query STRING, w BIGINT, c BIGINT)
        WITH ('connector' = 'filesystem', 'path' = '{sink.as_uri()}', 'format' = 'csv')
    """)
    if args.variant == "table":
        done = t_env.execute_sql(f"""
            INSERT INTO counts
            SELECT query, UNIX_TIMESTAMP(CAST(window_start AS STRING)) * 1000, COUNT(*)
            FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rt), INTERVAL '{WINDOW_MS // 1000}' SECOND))
            GROUP BY query, window_start, window_end
        """)
    else:
        ds = t_env.to_data_stream(t_env.from_path("events"))
        key_type = Types.TUPLE([Types.STRING(), Types.LONG()])
        out_type = Types.ROW_NAMED(
            ["query", "w", "c"], [Types.STRING(), Types.LONG(), Types.LONG()]
        )
        counts = ds.key_by(
            lambda r: (r[2], r[1] // WINDOW_MS * WINDOW_MS), key_type=key_type
        ).process(WindowCount(args.variant == "kpf_dedup"), output_type=out_type)
        done = t_env.from_data_stream(counts).execute_insert("counts")
    done.wait()
    rows = [
        line.split(",")
        for f in sorted(sink.rglob("part-*"))
        for line in f.read_text(encoding="utf-8").splitlines()
    ]
    finish(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
