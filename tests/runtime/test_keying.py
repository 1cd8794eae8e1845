"""Keying at the producer (``millwheel/runtime/_keying.py``): rows carry their consumers'
keys, the consumer's own pass keys the rest, and both give the same rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from millwheel import (
    MAX_TIMESTAMP,
    ComputationOptions,
    ErrorPolicy,
    KeyExtractorError,
    MillwheelError,
    Record,
    SampleSource,
    Source,
    SourceBatch,
    Topology,
)
from millwheel._codec import decode_value, encode_value
from millwheel._record import decode_key, encode_key
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._interval import make_keying
from millwheel.runtime._keying import Keyer, interval_of
from millwheel.runtime._streams import FileStreamLog, records_table
from millwheel.runtime._wire import RowKind
from millwheel.testing import Harness

from ._chain import Double, Sum, by_n, chain


def _seen_stream(r: Record) -> str:
    return f"{r.stream}:{r.value['n']}"


def test_rows_are_keyed_for_the_consumers_of_their_stream_only():
    keyer = Keyer({"in": [("A", by_n), ("B", _seen_stream)], "out": [("C", by_n)]}, intervals=8)
    assert keyer.consumers_of(["in"]) == ["A", "B"] and keyer.consumers_of(["out", "nothing"]) == [
        "C"
    ]
    rows = [
        ("in", Record(None, {"n": 4}, 1, "a")),
        ("out", Record(None, {"n": 5}, 2, "b")),
        ("_summary", None),
        ("in", Record(None, {}, 3, "c")),
    ]
    cols = keyer.rows(rows, ["A", "B", "C"])
    assert [decode_key(k) if k else None for k in cols["key:A"]] == [1, None, None, None]
    assert cols["interval:A"][0] == interval_of(encode_key(1), 8)
    # the extractor sees the stream the record is read from, as in the harness
    assert decode_key(cols["key:B"][0]) == "in:4"
    assert [decode_key(k) if k else None for k in cols["key:C"]] == [None, 2, None, None]
    # a failed extractor leaves the row unkeyed: the consumer's own pass makes the dead letter
    assert cols["interval:A"][3] is None and cols["key:A"][3] is None


def _keying_args(table: pa.Table, needed: list[bool]) -> list[pa.Array]:
    """What the query passes the consumer's keying function: the row's columns where it is needed."""
    mask = pa.array([not x for x in needed])
    cols = [
        c
        for c in ("id", "ts", "key", "value", "fields")
        if c != "fields" or c in table.column_names
    ]
    args = [pa.array(needed)] + [
        pc.if_else(
            mask,
            pa.nulls(len(needed), table.schema.field(c).type),
            table.column(c).combine_chunks(),
        )
        for c in cols
    ]
    return (
        args if len(cols) == 5 else [*args, pa.nulls(len(needed), pa.binary())]
    )  # an undeclared stream: no fields


def test_the_consumer_pass_gives_the_rows_the_producer_would():
    recs = [Record(None, {"n": n}, 1_000 + n, f"r{n}") for n in range(20)] + [
        Record(None, {"x": 1}, 5, "bad")
    ]
    keyer = Keyer({"in": [("A", by_n)]}, intervals=4)
    table = records_table(recs, None, keyer, "in")
    assert table.column_names[-2:] == ["key:A", "interval:A"]
    key = make_keying("A", "in", by_n, 4)
    # a file without the producer's columns: every row is keyed by the consumer
    out = key(*_keying_args(table, [True] * len(recs))).to_pylist()
    assert [o["key"] for o in out[:-1]] == table.column("key:A").to_pylist()[:-1]
    assert [o["interval"] for o in out[:-1]] == table.column("interval:A").to_pylist()[:-1]
    assert {o["kind"] for o in out[:-1]} == {RowKind.RECORD} and all(
        o["id"] is None and o["value"] is None for o in out[:-1]
    )
    # the failed extractor: a dead letter replaces the row (the producer left it unkeyed)
    assert table.column("interval:A")[-1].as_py() is None
    dead = out[-1]
    assert dead["kind"] == RowKind.DEAD_LETTER and dead["key"] is None and dead["id"] != "bad"
    letter = decode_value(dead["value"])
    assert letter.record.id == "bad" and letter.computation == "A" and "KeyError" in letter.reason
    # rows the producer keyed: nothing is passed for them and nothing comes back (values never decoded)
    needed = [v is None for v in table.column("interval:A").to_pylist()]
    garbage = table.set_column(
        table.schema.get_field_index("value"),
        "value",
        pa.array([b"not a pickle"] * (len(recs) - 1) + [encode_value(recs[-1].value)]),
    )
    mixed = key(*_keying_args(garbage, needed)).to_pylist()
    assert all(all(v is None for v in o.values()) for o in mixed[:-1])
    assert mixed[-1] == dead
    # a batch the producer keyed whole: one vectorised check, an all-null result
    keyed_only = key(*_keying_args(garbage.slice(0, len(recs) - 1), needed[:-1]))
    assert keyed_only.null_count == 0 and all(
        keyed_only.field(i).null_count == len(recs) - 1 for i in range(6)
    )


@pytest.mark.spark
def test_producers_key_their_rows_and_unkeyed_files_still_arrive(spark, run_dir):
    """Injector and computation files carry ``key:C``/``interval:C``; a file written without
    them (an older writer) and a record whose extractor fails go through the consumer's pass."""
    t = chain(
        "keying", [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(30)], batch_size=10
    )
    legacy = FileStreamLog(Location.of(run_dir))  # no keyer: the rows carry no key columns
    legacy.ensure("in", "in")
    legacy.append(
        "in",
        "in",
        "legacy",
        [Record(None, {"n": 100 + i}, 1_050 + i, f"old{i}") for i in range(5)]
        + [Record(None, {"x": 0}, 1_060, "bad")],
    )
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    rt = SparkRuntime(t, run_dir, RuntimeSettings(drain=True, intervals=4, poll_ms=50), spark=spark)
    rt.run(timeout_s=600)
    # the file without key columns was there at start: Double's query has the keying
    # stage; Sum's input is all keyed by Double, so its query has none
    assert rt.computations["Double"].keying_stage and not rt.computations["Sum"].keying_stage
    expected = [2 * i for i in range(30)] + [2 * (100 + i) for i in range(5)]
    assert sorted(rt.values("doubled")) == sorted(expected)
    assert max(rt.values("sums")) == sum(expected)
    assert [r.value.reason for r in rt.dead_letters()] == ["KeyError: 'n'"]
    streams = Path(run_dir) / "streams"
    keyed = [pq.read_table(p) for p in sorted((streams / "in" / "in").glob("s*.parquet"))]
    assert keyed and all(t.column_names[-2:] == ["key:Double", "interval:Double"] for t in keyed)
    for table in keyed:
        for kb, iv, value in zip(
            table.column("key:Double").to_pylist(),
            table.column("interval:Double").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        ):
            assert kb == encode_key(by_n(Record(None, decode_value(value), 0, "x")))
            assert iv == interval_of(kb, 4)
    doubled = [pq.read_table(p) for p in (streams / "doubled" / "Double").glob("*.parquet")]
    assert doubled and all(
        decode_key(k) == "all" for t in doubled for k in t.column("key:Sum").to_pylist()
    )
    # one source per input directory, plus the heartbeats: the driver reads which files a
    # batch consumed from the offset log by source position (``_query.ConsumedFiles``), so an
    # input directory must appear in the plan once
    for name in ("Double", "Sum"):
        offsets = Path(run_dir) / "checkpoints" / name / "offsets"
        last = max(offsets.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
        assert len(last.read_text().splitlines()[2:]) == 2, last.read_text()


class _UnkeyedFileMidRun(Source):
    """The injector's own batches are keyed for their consumer; after the first one, a file
    without key columns (an external writer) appears in the same stream directory."""

    def __init__(
        self, run_dir: str, first: list[Record], legacy: list[Record], rest: list[Record]
    ) -> None:
        self.run_dir, self.first, self.legacy, self.rest = run_dir, first, legacy, rest

    def batches(self, injector: str = "in", stream: str = "in"):
        yield SourceBatch(self.first, min(r.timestamp for r in self.legacy + self.rest))
        FileStreamLog(Location.of(self.run_dir)).append("in", "in", "external", self.legacy)
        yield SourceBatch(self.rest, MAX_TIMESTAMP)


@pytest.mark.spark
def test_a_query_without_the_keying_stage_keys_what_it_must_and_restarts_with_it_when_needed(
    spark, run_dir
):
    """All input keyed at start: no keying stage. A record whose extractor fails at the
    producer is dead-lettered by the step; a file without key columns that appears later
    fails the batch once, and the query restarts with the keying stage: every record
    arrives exactly once, and the restart is not counted as a failure."""
    first = [Record(None, {"n": i}, 1_000 + i, f"r{i}") for i in range(10)] + [
        Record(None, {"x": 0}, 1_005, "bad")
    ]
    # ids chosen so that some rows are sent (by Spark's hash of the id) to another interval
    # than their key's: the batch must fail and be run again with the keying stage
    legacy = [Record(None, {"n": 100 + i}, 1_050 + i, f"old{i}") for i in range(6)]
    sent_to = spark.sql(
        "SELECT " + ", ".join(f"pmod(xxhash64('{r.id}'), 4)" for r in legacy)
    ).collect()[0]
    assert any(
        iv != interval_of(encode_key(by_n(r)), 4) for iv, r in zip(sent_to, legacy, strict=True)
    )
    rest = [Record(None, {"n": 200 + i}, 1_100 + i, f"s{i}") for i in range(10)]
    t = Topology("midrun")
    t.injector("in", _UnkeyedFileMidRun(run_dir, first, legacy, rest))
    t.computation(Double, inputs={"in": by_n}, outputs=["doubled"])
    t.computation(Sum, inputs={"doubled": lambda r: "all"}, outputs=["sums"])
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    lines: list[str] = []
    rt = SparkRuntime(
        t,
        run_dir,
        RuntimeSettings(drain=True, intervals=4, poll_ms=50),
        spark=spark,
        log=lines.append,
    )
    rt.run(timeout_s=600)
    double = rt.computations["Double"]
    assert double._keying_forced and double.keying_stage and double.restart_policy.restarts == 0
    assert any("restarting its query with the keying stage" in line for line in lines)
    expected = [2 * r.value["n"] for r in first[:-1] + legacy + rest]
    assert sorted(rt.values("doubled")) == sorted(expected)
    assert max(rt.values("sums")) == sum(expected)
    assert [(r.value.record.id, r.value.reason) for r in rt.dead_letters()] == [
        ("bad", "KeyError: 'n'")
    ]


def _raising_keying_topology() -> Topology:
    records = [Record(None, {"n": n}, 1_000 + n, f"r{n}") for n in range(5)] + [
        Record(None, {"x": 1}, 2_000, "bad")
    ]
    t = Topology("raise_on_keying")
    t.injector("in", SampleSource(records, batch_size=10))
    t.computation(
        Double,
        inputs={"in": by_n},
        outputs=["doubled"],
        options=ComputationOptions(on_error=ErrorPolicy.RAISE),
    )
    return t


def test_a_key_extractor_failing_under_raise_raises_in_the_consumer_pass():
    """One keying-failure rule for both backends (``_delivery.key_record``): under
    ``ErrorPolicy.RAISE`` a failed extractor raises instead of making a dead letter."""
    table = records_table([Record(None, {"x": 1}, 5, "bad")], None, None, "in")
    key = make_keying("A", "in", by_n, 4, ErrorPolicy.RAISE)
    with pytest.raises(
        KeyExtractorError,
        match=r"computation 'A': its key extractor failed: KeyError: 'n' \(stream 'in', record 'bad'\)",
    ):
        key(*_keying_args(table, [True]))
    h = Harness(_raising_keying_topology(), raise_errors=False)
    with pytest.raises(
        KeyExtractorError, match=r"computation 'Double': its key extractor failed: KeyError: 'n'"
    ):
        h.run_sources()


@pytest.mark.spark
def test_a_key_extractor_failing_under_raise_stops_the_run_on_spark_as_in_the_harness(
    spark, run_dir
):
    rt = SparkRuntime(
        _raising_keying_topology(), run_dir, RuntimeSettings(drain=True, intervals=2), spark=spark
    )
    with pytest.raises(
        MillwheelError, match=r"computation 'Double': its key extractor failed: KeyError: 'n'"
    ):
        rt.run(timeout_s=300)
    assert rt.dead_letters() == []  # no dead letter was made of it: the run stopped
