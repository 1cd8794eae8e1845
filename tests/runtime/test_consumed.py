"""A computation's input low watermark (``millwheel/runtime/_consumed.py``; docs/runtime.md,
"Low watermarks and timers"): the reported one counts only published batches' files as
consumed, the heartbeat's also the files of the batch Spark planned already — and never
a file no planned batch reads, which would make on-time records late."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from millwheel import Record, SampleSource
from millwheel._record import MAX_TIMESTAMP
from millwheel.runtime._consumed import (
    ConsumedFiles,
    heartbeat_batch,
    input_watermarks,
    read_input_watermarks,
)
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog
from millwheel.runtime._wire import from_spark, to_spark

PAIR = ("s", "P")


def _plan(cp, batch: int, names: list[str], streams: FileStreamLog) -> None:
    """Batch ``batch`` of the query at ``cp`` reads ``names`` of ``s/P`` (its source 1; source 0: heartbeats)."""
    (cp / "sources" / "1").mkdir(parents=True, exist_ok=True)
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    loc = streams.location(*PAIR)
    lines = ["v1"] + [
        json.dumps({"path": loc.child(n).uri, "timestamp": 0, "batchId": batch}) for n in names
    ]
    (cp / "sources" / "1" / str(batch)).write_text("\n".join(lines) + "\n")
    (cp / "offsets" / str(batch)).write_text(
        f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n{{"logOffset":{batch}}}\n'
    )


def _listed(streams: FileStreamLog) -> dict[tuple[str, str], dict[str, int]]:
    return {PAIR: streams.files(*PAIR, live_only=True)}


def _planned(files, *batches: slice) -> ConsumedFiles:
    """The query at ``files``' checkpoint with batch ``i`` planned over ``names[batches[i]]``, read."""
    streams, names, cp = files
    for i, part in enumerate(batches):
        _plan(cp, i, names[part], streams)
    consumed = ConsumedFiles(Location.of(str(cp)))
    consumed.refresh()
    return consumed


@pytest.fixture
def files(tmp_path):
    """Four published files of ``s/P``, oldest timestamps 1000..4000."""
    streams = FileStreamLog(Location.of(str(tmp_path / "run")))
    streams.ensure(*PAIR)
    for i in range(1, 5):
        streams.append(
            *PAIR,
            f"s{i:010d}",
            [Record(i, {"n": i}, i * 1_000, f"r{i}")],
            sender_watermark=i * 1_000,
        )
    names = sorted(streams.files(*PAIR, live_only=True))
    return streams, names, tmp_path / "run" / "checkpoints" / "C"


def test_the_heartbeat_counts_the_planned_batch_and_nothing_past_it(files):
    streams, names, cp = files
    consumed = _planned(files, slice(0, 1), slice(1, 3))  # published; planned, running
    assert consumed.planned() == 1
    # upstream finished (+inf): only the files themselves hold
    assert input_watermarks(MAX_TIMESTAMP, _listed(streams), consumed, 0, 1) == (2_000, 4_000, 3, 1)
    assert input_watermarks(MAX_TIMESTAMP, _listed(streams), consumed, 0, 0) == (2_000, 2_000, 3, 3)
    assert input_watermarks(1_500, _listed(streams), consumed, 0, 1) == (
        1_500,
        1_500,
        3,
        1,
    )  # the upstream bounds both
    _plan(cp, 2, names[3:], streams)
    consumed.refresh()
    assert input_watermarks(MAX_TIMESTAMP, _listed(streams), consumed, 0, consumed.planned()) == (
        2_000,
        MAX_TIMESTAMP,
        3,
        0,
    )


def test_an_uncommitted_batch_is_read_again_a_rescale_may_plan_it_anew(files):
    streams, _, cp = files
    consumed = _planned(files, slice(0, 1), slice(1, 2))
    assert input_watermarks(MAX_TIMESTAMP, _listed(streams), consumed, 0, 1)[1] == 3_000
    (cp / "offsets" / "1").unlink()  # dropped (``drop_planned_batch``): nothing of it counts
    assert input_watermarks(MAX_TIMESTAMP, _listed(streams), consumed, 0, 1)[1] == 2_000


class _PlannedWhileListed:
    """The stream log, with the race of a live run: Spark plans a batch over the files just
    after the driver listed them (its query polls its sources every few milliseconds)."""

    def __init__(self, streams: FileStreamLog, cp, batch: int) -> None:
        self.streams, self.cp, self.batch = streams, cp, batch

    def files(self, stream: str, producer: str, live_only: bool = False) -> dict[str, int]:
        listed = self.streams.files(stream, producer, live_only=live_only)
        _plan(self.cp, self.batch, sorted(listed)[self.batch :], self.streams)
        return listed


def test_a_batch_planned_while_the_files_are_listed_counts(files):
    streams, names, cp = files
    _plan(cp, 0, names[:1], streams)
    consumed = ConsumedFiles(Location.of(str(cp)))
    consumed.refresh()
    read = []
    upstream = lambda: read.append("upstream") or MAX_TIMESTAMP  # noqa: E731
    (reported, heartbeat, pending, waiting), planned = read_input_watermarks(
        "C", [PAIR], _PlannedWhileListed(streams, cp, 1), consumed, 0, upstream
    )
    # the planned batch is read after the listing, the file sources' logs after it: the files
    # the query took while they were listed wait for no later batch, so no heartbeat batch of
    # their own; the reported watermark still holds at them until that batch is published
    assert (planned, reported, heartbeat, pending, waiting) == (1, 2_000, MAX_TIMESTAMP, 3, 0)
    assert read == ["upstream"]
    # the order matters: the same race seen with the plan read before the listing
    consumed2 = ConsumedFiles(Location.of(str(cp)))
    (cp / "offsets" / "1").unlink()
    before = heartbeat_batch("C", [PAIR], consumed2, 0)
    consumed2.refresh()
    listed = {PAIR: _PlannedWhileListed(streams, cp, 1).files(*PAIR, live_only=True)}
    assert input_watermarks(MAX_TIMESTAMP, listed, consumed2, 0, before)[1:] == (2_000, 3, 3)


def test_a_file_the_planned_batch_does_not_read_still_holds_the_heartbeat(files):
    streams, names, cp = files
    _plan(cp, 0, names[:1], streams)
    _plan(cp, 1, names[1:3], streams)
    consumed = ConsumedFiles(Location.of(str(cp)))
    (_, heartbeat, _, waiting), planned = read_input_watermarks(
        "C", [PAIR], streams, consumed, 0, lambda: MAX_TIMESTAMP
    )
    assert (planned, heartbeat, waiting) == (1, 4_000, 1)
    # and the upstream, read before the listing, bounds it: a file published after the
    # listing carries timestamps at or above it
    assert (
        read_input_watermarks("C", [PAIR], streams, consumed, 0, lambda: 3_500)[0].heartbeat
        == 3_500
    )


def test_where_spark_lists_heartbeats_first_waiting_files_do_not_hold_the_heartbeat(files):
    # the batch that reads a heartbeat lists the inputs after it was written, so it reads
    # every file published before: the heartbeat is the upstream's watermark, and the
    # timers it makes due fire in the batch that reads those files, after their records
    streams = files[0]
    consumed = _planned(files, slice(0, 1), slice(1, 2))
    listed = _listed(streams)
    assert input_watermarks(MAX_TIMESTAMP, listed, consumed, 0, 1, listed_first=True) == (
        2_000,  # the reported watermark still holds at every file no published batch read
        MAX_TIMESTAMP,
        3,
        2,  # still waiting: ``_heartbeat_needed`` writes the heartbeat for them
    )
    assert input_watermarks(3_500, listed, consumed, 0, 1, listed_first=True)[:2] == (2_000, 3_500)
    (_, heartbeat, _, waiting), planned = read_input_watermarks(
        "C", [PAIR], streams, consumed, 0, lambda: 3_500, listed_first=True
    )
    assert (planned, heartbeat, waiting) == (1, 3_500, 2)
    # not for a computation that reads what it writes: its planned batch's productions,
    # not published yet, may be older than its input
    (_, heartbeat, _, _), _ = read_input_watermarks(
        "P", [PAIR], streams, consumed, 0, lambda: 3_500, listed_first=True
    )
    assert heartbeat == 2_000


def test_a_computation_that_reads_what_it_writes_counts_published_batches_only(files):
    _, _, cp = files
    _plan(cp, 0, [], files[0])
    _plan(cp, 3, [], files[0])
    consumed = ConsumedFiles(Location.of(str(cp)))
    assert heartbeat_batch("C", [PAIR], consumed, 0) == 3
    # its planned batch's productions are not published yet, and may be older than its input
    assert heartbeat_batch("P", [PAIR], consumed, 0) == 0
    assert heartbeat_batch("C", [("dead_letters", "C"), PAIR], consumed, 0) == 0


@pytest.mark.spark
@pytest.mark.parametrize(
    ("per_trigger", "records", "apart_ms"),
    [(1, 24, 500), (None, 400, 250)],
    ids=["one-file-a-batch", "listed-first"],
)
def test_a_heartbeat_fires_no_timer_before_the_records_of_the_files_it_counts(
    tmp_path, spark, second_counts, per_trigger, records, apart_ms
):
    # each second's records in several files. One file a batch (maxFilesPerTrigger): the
    # injector is finished (+inf) long before the query has planned its files, so a
    # heartbeat that counted more than the planned batch would move the watermark past
    # files still waiting. Every file a listing finds, heartbeats listed first: a heartbeat
    # counts files no batch planned yet, and a second's timer fires in the batch that reads
    # them (a computation's productions read so, on every plan: tests/conformance/test_chain.py).
    # Either way, a timer fired before a file of its second was read emits the second twice
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    sent = [
        Record(None, {"key": f"k{i % 3}"}, apart_ms * (i // 4) + i % 4, f"r{i}")
        for i in range(records)
    ]
    poll = 50 if per_trigger else 20
    settings = RuntimeSettings(
        drain=True,
        intervals=2,
        max_files_per_trigger=per_trigger,
        poll_ms=poll,
        heartbeat_ms=poll,
    )
    rt = SparkRuntime(
        second_counts(SampleSource(sent, batch_size=4)),
        str(tmp_path / "run"),
        settings,
        spark=spark,
    )
    rt.run(timeout_s=300)
    query = rt.computations["SecondCounts"]
    assert query.listed_first is (per_trigger is None)
    consumed = ConsumedFiles(query.checkpoint)
    consumed.refresh()
    assert {i for i, _ in consumed.heartbeat_files.values()} <= {0}  # listed first
    out = rt.output("counts")
    assert query.metrics["late"] == 0
    assert Counter((r.value["key"], r.value["second"]) for r in out).most_common(1)[0][1] == 1, (
        "a second's timer fired early"
    )
    assert second_counts.answer(out) == Counter(
        (r.value["key"], r.timestamp // 1_000 * 1_000) for r in sent
    )
    if per_trigger:
        assert query.batches >= 6  # one file a batch: the planned batch ran ahead of the others


def _query(handles_timers: bool, summaries: dict) -> Any:
    from types import SimpleNamespace

    from millwheel.runtime._query import ComputationQuery

    q = ComputationQuery.__new__(ComputationQuery)
    q.intervals, q.summaries, q.plan = 2, summaries, None
    q.spec = SimpleNamespace(handles_timers=handles_timers)
    return q


def test_a_heartbeat_waits_while_it_has_nothing_to_do():
    from millwheel.runtime._wire import IntervalSummary

    idle = {i: IntervalSummary(i, None, None, None, 0) for i in range(2)}
    timer = {0: IntervalSummary(0, 5_000, 5_000, None, 1), 1: idle[1]}
    needed = _query(True, idle)._heartbeat_needed
    assert not needed(
        9_000, 0, False
    )  # nothing waits, nothing runs, no timer: a batch that does nothing
    assert needed(9_000, 1, False)  # input a later batch reads is judged under the newest watermark
    assert needed(9_000, 0, True)  # the batch in flight may set timers this watermark makes due
    assert not _query(False, idle)._heartbeat_needed(9_000, 0, True)  # it sets none
    assert _query(True, timer)._heartbeat_needed(5_000, 0, False)
    assert not _query(True, timer)._heartbeat_needed(4_999, 0, False)
    assert _query(True, {0: idle[0]})._heartbeat_needed(
        9_000, 0, False
    )  # interval 1's holds unknown


def test_a_heartbeat_goes_as_rows_to_the_intervals_it_may_make_timers_due_in(tmp_path):
    # on a plan that takes them (the interval plans) a heartbeat also goes to key intervals,
    # applied in the batch that reads it (docs/runtime.md, "Heartbeats in the batch that
    # reads them"); every interval when the driver cannot tell which will have timers due
    from types import SimpleNamespace

    import pyarrow.parquet as pq

    from millwheel._record import MIN_TIMESTAMP
    from millwheel.runtime._wire import IntervalSummary

    idle = IntervalSummary(1, None, None, None, 0)
    q = _query(True, {0: IntervalSummary(0, 5_000, 5_000, None, 1), 1: idle})
    q.plan = SimpleNamespace(addresses_heartbeats=True)
    assert q._addressed(5_000, 0, False) == {0}  # the timer it makes due
    assert q._addressed(4_999, 0, False) == set()
    assert q._addressed(4_999, 3, False) == {0, 1}  # waiting input may set timers anywhere
    assert q._addressed(4_999, 0, True) == {0, 1}  # so may the batch in flight
    assert _query(True, {0: idle})._addressed(0, 0, False) == set()  # no plan yet
    for timerless, plan in ((False, True), (True, False)):  # nothing to fire; the plan's own way
        other = _query(timerless, {})
        other.plan = SimpleNamespace(addresses_heartbeats=plan)
        assert other._addressed(9_000, 1, True) == set()
    # the rows: interval -1 for Spark's watermark, one per addressed interval, and a tick
    # of another interval carrying the newest watermark sent before it
    q.heartbeats, q._hb_seq, q._hb_shown, q._hb_sent = (
        Location.of(str(tmp_path)),
        0,
        -1,
        MIN_TIMESTAMP,
    )
    q._reached, q.batches = {}, 3
    q._write_heartbeat(700, [(1, 42)], frozenset({0}), upto=5)
    q._hb_sent, q._hb_upto = 300, 4
    q._write_heartbeat(None, [(1, 43)])

    def rows(name):
        columns = ["interval", "wm", "now", "upto"]
        return sorted(
            zip(*pq.read_table(tmp_path / name, columns=columns).to_pydict().values(), strict=True)
        )

    # each row that carries a watermark says the newest batch it counts as consumed
    assert rows("000000000000.parquet") == [
        (-1, 700, None, 5),
        (0, 700, None, 5),
        (1, None, 42, None),
    ]
    assert rows("000000000001.parquet") == [(1, to_spark(300), 43, 4)]
    # what each interval's rows carried: a timer at or below it fires when they are read,
    # so the driver does not tick it (``_wire.due_ticks``) — until two batches have been
    # published since, which have read them
    assert q._unread() == {0: from_spark(700), 1: 300}
    q.batches = 5
    assert q._unread() == {}


def test_a_heartbeat_for_waiting_input_waits_for_the_query_to_take_it():
    from types import SimpleNamespace

    q = _query(False, {})
    q.rt, q._waiting_since = SimpleNamespace(settings=SimpleNamespace(heartbeat_ms=200)), None
    # new files: a query between batches plans them within milliseconds; a heartbeat written
    # now would be read only after that data batch, in a batch of its own
    assert q._waited(2) == 0
    assert q._waited(2) == 0
    q._waiting_since -= (
        0.2  # still waiting a heartbeat interval later: a batch in flight holds them
    )
    assert q._waited(2) == 2
    assert q._waited(0) == 0
    assert q._waited(1) == 0  # a new wait starts over
    q.rt.settings.heartbeat_ms = 0
    assert q._waited(1) == 1
