"""A user-written streaming source with Spark 4's Python Data Source API, read by ``millwheel.SparkSource``.

An example of the kind of source a Spark user writes: a deterministic sequence of events
``(seq, ts, key, partition)`` served in micro-batches with real offsets
``{"next": n, "lw": ms}``. ``next`` is how far the sequence has been read; ``lw`` is the
source's own low watermark — the oldest event time still to come (MillWheel §5.2), or
``MAX_TIMESTAMP`` once the sequence is finished — which ``SparkSource(...,
offset_watermark="lw")`` takes as the injector low watermark. Spark keeps the offsets in
the query's offset log, so a batch replayed after a crash reads exactly the same rows.

Options: ``count`` (events in all), ``rows_per_batch``, ``partitions``, ``start_ms`` and
``step_ms`` (event ``i`` happens at ``start_ms + i * step_ms``, minus up to
``disorder_ms`` of deterministic disorder), ``keys``, ``bad_every`` (every n-th event has
no timestamp: bad input the injector turns into a dead letter; 0: none).

    from millwheel import SparkSource
    from examples.sequence_source import FORMAT, SequenceDataSource

    source = SparkSource(
        lambda spark: spark.readStream.format(FORMAT).option("count", 5000).load(),
        data_sources=[SequenceDataSource], id="seq", timestamp="ts", offset_watermark="lw",
    )

:func:`events` is the same sequence as plain rows: the batch answer of a test, and the
``rows=`` of the same source on the harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import xxhash
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

FORMAT = "millwheel_sequence"
SCHEMA = "seq long, ts long, key string, partition int"
MAX_TIMESTAMP = 2**63 - 1

DEFAULTS = {
    "count": "1000",
    "rows_per_batch": "250",
    "partitions": "2",
    "start_ms": "1700000000000",
    "step_ms": "10",
    "disorder_ms": "0",
    "keys": "10",
    "bad_every": "0",
}


def _opts(options: dict[str, str]) -> dict[str, int]:
    return {k: int(options.get(k, v)) for k, v in DEFAULTS.items()}


def event(i: int, o: dict[str, int]) -> dict[str, Any]:
    """Event ``i`` of the sequence with options ``o`` (``ts`` ``None`` for a bad one)."""
    jitter = xxhash.xxh64_intdigest(str(i).encode()) % (o["disorder_ms"] + 1)
    bad = o["bad_every"] > 0 and i % o["bad_every"] == o["bad_every"] - 1
    return {
        "seq": i,
        "ts": None if bad else o["start_ms"] + i * o["step_ms"] - jitter,
        "key": f"k{i % o['keys']}",
        "partition": i % o["partitions"],
    }


def events(**options: Any) -> list[dict[str, Any]]:
    """The whole sequence as plain rows (the batch answer; ``SparkSource(rows=...)`` on the harness)."""
    o = _opts({k: str(v) for k, v in options.items()})
    return [event(i, o) for i in range(o["count"])]


def low_watermark(next_seq: int, o: dict[str, int]) -> int:
    """The oldest event time still to come once ``next_seq`` events have been read."""
    if next_seq >= o["count"]:
        return MAX_TIMESTAMP
    return o["start_ms"] + next_seq * o["step_ms"] - o["disorder_ms"]


class _Slice(InputPartition):
    def __init__(self, lo: int, hi: int, part: int) -> None:
        super().__init__((lo, hi, part))


class SequenceStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.o = _opts(options)

    def initialOffset(self) -> dict[str, int]:
        return {"next": 0, "lw": low_watermark(0, self.o)}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:  # noqa: ARG002
        at = (start or self.initialOffset())["next"]
        nxt = min(self.o["count"], at + self.o["rows_per_batch"])
        return {"next": nxt, "lw": low_watermark(nxt, self.o)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [_Slice(start["next"], end["next"], p) for p in range(self.o["partitions"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        lo, hi, part = partition.value  # type: ignore[attr-defined]
        for i in range(lo, hi):
            if i % self.o["partitions"] == part:
                e = event(i, self.o)
                yield (e["seq"], e["ts"], e["key"], e["partition"])


class SequenceDataSource(DataSource):
    """``spark.readStream.format("millwheel_sequence")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: ARG002
        return SequenceStreamReader(dict(self.options))
