"""Bytewax's windowed count, one dataflow per process (run by ``bench/peers_bench.py`` with
the peers' virtualenv, ``bench/peers/setup.sh``).

The bench's input Parquet files, read in order (one input partition whose position, a
file and a batch in it, is its resume state) by ``pyarrow``; ``count_window`` with a
``TumblingWindower`` of 10 s and an ``EventClock`` on ``ts`` whose watermark is the
largest timestamp seen less ``--watermark-delay-ms`` (its system-time part frozen: see
``main``), keyed by query; one worker (``bytewax.run``'s default). With
``--recovery DIR``: a SQLite recovery directory (one partition), state snapshots every
``--epoch-s`` (Bytewax's epoch, 10 s by default), so a restart resumes the input and the
windows from the last snapshot. Items a window would drop as late are counted and printed
(the bench's check would also miss them).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bytewax.operators as op  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _job import WINDOW_MS, finish  # noqa: E402
from bytewax.dataflow import Dataflow  # noqa: E402
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition  # noqa: E402
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window  # noqa: E402
from bytewax.outputs import DynamicSink, StatelessSinkPartition  # noqa: E402
from bytewax.recovery import RecoveryConfig, init_db_dir  # noqa: E402
from bytewax.run import cli_main  # noqa: E402

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: records per input batch (a file of the default input holds 10,000)
BATCH = 10_000


class _FilesPartition(StatefulSourcePartition):
    def __init__(self, files: list[Path], resume: tuple[int, int] | None) -> None:
        self.files = files
        self.pos = resume or (0, 0)
        self._open()

    def _open(self) -> None:
        f, b = self.pos
        self.batches = iter(())
        if f < len(self.files):
            self.batches = pq.ParquetFile(self.files[f]).iter_batches(
                batch_size=BATCH, columns=["id", "ts", "query"]
            )
            for _ in range(b):
                next(self.batches)

    def next_batch(self) -> list[tuple[str, int, str]]:
        f, b = self.pos
        if f >= len(self.files):
            raise StopIteration
        batch = next(self.batches, None)
        if batch is None:
            self.pos = (f + 1, 0)
            self._open()
            return []
        self.pos = (f, b + 1)
        return list(
            zip(
                batch.column(0).to_pylist(),
                batch.column(1).to_pylist(),
                batch.column(2).to_pylist(),
                strict=True,
            )
        )

    def snapshot(self) -> tuple[int, int]:
        return self.pos


class ParquetFiles(FixedPartitionedSource):
    """The files of a directory, in name order (the bench's files are named in time order)."""

    def __init__(self, directory: Path) -> None:
        self.files = sorted(directory.glob("*.parquet"))

    def list_parts(self) -> list[str]:
        return ["all"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: tuple[int, int] | None
    ) -> _FilesPartition:
        return _FilesPartition(self.files, resume_state)


class _ListPartition(StatelessSinkPartition):
    def __init__(self, items: list) -> None:
        self.items = items

    def write_batch(self, items: list) -> None:
        self.items.extend(items)


class ListSink(DynamicSink):
    """Items into a list of this process (one worker)."""

    def __init__(self, items: list) -> None:
        self.items = items

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ListPartition:
        return _ListPartition(self.items)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", required=True, help="directory of the input Parquet files")
    p.add_argument("--out", required=True)
    p.add_argument("--watermark-delay-ms", type=int, default=0)
    p.add_argument("--recovery", default=None, help="a fresh recovery directory: recovery on")
    p.add_argument("--epoch-s", type=float, default=10.0)
    args = p.parse_args()

    counts: list = []
    late: list = []
    flow = Dataflow("window_count")
    records = op.input("records", flow, ParquetFiles(Path(args.files)))
    # an event-time watermark as Spark's and Flink's: the largest timestamp seen less the
    # delay. EventClock adds the system time since that record was seen (its now_getter):
    # frozen here, as a run longer than the delay closed windows early, which then came out
    # twice with part of their counts (a 1M-record run with recovery at load 10). And no
    # wake-ups (to_system_utc): for records long past every key's windows are due at once,
    # so every key was woken over and over (100k records: 135 s against 15.7 s)
    clock = EventClock(
        lambda r: EPOCH + timedelta(milliseconds=r[1]),
        wait_for_system_duration=timedelta(milliseconds=args.watermark_delay_ms),
        now_getter=lambda: EPOCH,
        to_system_utc=lambda t: None,
    )
    windows = count_window(
        "count",
        records,
        clock,
        TumblingWindower(length=timedelta(milliseconds=WINDOW_MS), align_to=EPOCH),
        key=lambda r: r[2],
    )
    op.output("counts", windows.down, ListSink(counts))
    op.output("late", windows.late, ListSink(late))
    recovery = None
    if args.recovery:
        Path(args.recovery).mkdir(parents=True)
        init_db_dir(Path(args.recovery), 1)
        recovery = RecoveryConfig(Path(args.recovery))
    cli_main(
        flow,
        workers_per_process=1,
        epoch_interval=timedelta(seconds=args.epoch_s),
        recovery_config=recovery,
    )
    if late:
        print(f"bytewax: {len(late)} records came late and were dropped", flush=True)
    finish(((k, w * WINDOW_MS, c) for k, (w, c) in counts), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
