"""The worker's per-interval step (``millwheel/runtime/_interval.py``) without Spark: rows a
producer did not key, reaching a query planned without the keying stage."""

from __future__ import annotations

import pandas as pd
import pytest

from millwheel import Computation, Record, Topology
from millwheel._codec import decode_value, encode_value
from millwheel._contract import dedup_collect_at
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._record import decode_key, encode_key
from millwheel.runtime._interval import KEYING_STAGE_NEEDED, KeyingStageNeeded, MemoryGroupState
from millwheel.runtime._keying import interval_of
from millwheel.runtime._wire import SUMMARY_STREAM, IntervalSummary, RowKind, to_spark
from millwheel.runtime.plans.intervals import IntervalStep

from ._chain import Double, by_n

INTERVALS = 4


@pytest.fixture
def step() -> IntervalStep:
    t = Topology("interval")
    t.injector("in", None)
    t.computation(Double, inputs={"in": by_n}, outputs=["doubled"])
    return IntervalStep(t.validate().computations["Double"], groups=list(range(INTERVALS)))


def _frame(rows: list[tuple[RowKind, bytes | None, Record]]) -> pd.DataFrame:
    """Input rows as the query hands them to the step (``_query.py``: ``KEYED_SCHEMA``)."""
    return pd.DataFrame(
        {
            "kind": [int(k) for k, _, _ in rows],
            "key": [kb for _, kb, _ in rows],
            "id": [r.id for _, _, r in rows],
            "ts": [r.timestamp for _, _, r in rows],
            "value": [encode_value(r.value) for _, _, r in rows],
            "wm": pd.array([None] * len(rows), dtype="Int64"),
            "stream": ["in"] * len(rows),
            "src": ["f0.parquet"] * len(rows),
            "row": list(range(len(rows))),
            "now": pd.array([None] * len(rows), dtype="Int64"),
        }
    )


def _run(step: IntervalStep, interval: int, frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat(list(step((interval,), iter([frame]), MemoryGroupState())))


def _interval_of_n(n: int) -> int:
    return interval_of(encode_key(n % 3), INTERVALS)


def test_a_row_its_producer_did_not_key_is_keyed_and_stepped_where_its_key_lives(step):
    here = _interval_of_n(1)
    keyed = Record(None, {"n": 1}, 10, "k1")
    unkeyed = Record(None, {"n": 4}, 11, "u4")  # the same key as n=1, so the same interval
    out = _run(
        step,
        here,
        _frame([(RowKind.RECORD, encode_key(1), keyed), (RowKind.UNKEYED, None, unkeyed)]),
    )
    doubled = out[out["stream"] == "doubled"]
    assert sorted(decode_value(v) for v in doubled["value"]) == [2, 8]
    assert {decode_key(k) for k in doubled["key"]} == {1}
    summary = IntervalSummary.decode(out[out["stream"] == SUMMARY_STREAM]["value"].iloc[0])
    assert (
        summary.metrics["records_in"] == 2
        and summary.metrics["processed"] == 2
        and summary.keys == 1
    )


def test_a_failed_extractor_becomes_a_dead_letter_in_the_interval_it_was_sent_to(step):
    bad = Record(None, {"x": 0}, 12, "bad")
    out = _run(step, 3, _frame([(RowKind.UNKEYED, None, bad)]))
    letters = out[out["stream"] == DEAD_LETTER_STREAM]
    assert len(letters) == 1
    letter = decode_value(letters["value"].iloc[0])
    assert (
        letter.record.id == "bad" and letter.computation == "Double" and "KeyError" in letter.reason
    )
    summary = IntervalSummary.decode(out[out["stream"] == SUMMARY_STREAM]["value"].iloc[0])
    assert summary.metrics["dead_letters"] == 1 and summary.metrics["records_in"] == 1


def test_a_row_whose_key_lives_elsewhere_fails_the_batch_for_the_keying_stage(step):
    elsewhere = next(i for i in range(INTERVALS) if i != _interval_of_n(2))
    with pytest.raises(KeyingStageNeeded, match=KEYING_STAGE_NEEDED) as info:
        _run(step, elsewhere, _frame([(RowKind.UNKEYED, None, Record(None, {"n": 2}, 13, "u2"))]))
    assert "'u2'" in str(info.value) and f"sent to {elsewhere}" in str(info.value)


@pytest.mark.spark
def test_the_timestamp_edges_on_spark(tmp_path, spark, edge_timers):
    # the harness twins are in tests/test_timers.py: a wall-time flush that produces without
    # a timestamp (whatever the watermark is when it fires) and an event-time timer at
    # MAX_TIMESTAMP that fires when the input is finished, on time for a consumer that drops late records
    from millwheel import SampleSource
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    words = [{"word": w, "ts": 1_000 + i} for i, w in enumerate(["cat", "dog", "cat"])]
    rt = SparkRuntime(
        edge_timers(SampleSource(words, timestamp="ts")),
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=2),
        spark=spark,
    )
    rt.run(timeout_s=300)
    assert rt.dead_letters() == []
    assert sorted((v["key"], v["total"]) for v in rt.values("totals")) == [("cat", 2), ("dog", 1)]
    assert rt.computations["Totals"].metrics["late"] == 0
    assert {v["key"] for v in rt.values("flushes")} == {"cat", "dog"}


class Closer(Computation):
    """A low-watermark timer at each record's timestamp; its firing is produced."""

    def process_record(self, record: Record) -> None:
        self.set_timer("close", record.timestamp)

    def process_timer(self, timer) -> None:
        self.produce("closed", timer.timestamp)


def _summary(out: pd.DataFrame) -> IntervalSummary:
    return IntervalSummary.decode(out[out["stream"] == SUMMARY_STREAM]["value"].iloc[0])


def _heartbeat(wm: int | None, now: int | None = None, upto: int | None = None) -> pd.DataFrame:
    """A row of the driver's addressed to the interval (``_query._write_heartbeat``): no kind."""
    frame = _frame([(RowKind.RECORD, None, Record(None, None, 0, None))])
    frame["kind"] = pd.array([None], dtype="Int64")
    frame["wm"] = pd.array([wm], dtype="Int64")
    frame["now"] = pd.array([now], dtype="Int64")
    frame["upto"] = pd.array([upto], dtype="Int64")
    return frame


def test_a_heartbeat_addressed_to_the_interval_fires_its_timers_in_the_batch_that_reads_it(
    monkeypatch,
):
    # Spark's watermark moves one batch after the heartbeat it read; a row addressed to the
    # interval carries it into the batch that reads it (docs/runtime.md, "Heartbeats in the
    # batch that reads them"), so the timer fires without a no-data batch after it
    import millwheel.runtime._interval as interval_mod

    monkeypatch.setattr(interval_mod, "task_batch_id", lambda: 7)  # the micro-batch running
    t = Topology("closer")
    t.injector("in", None)
    t.computation(Closer, inputs={"in": by_n}, outputs=["closed"])
    step = IntervalStep(t.validate().computations["Closer"], groups=list(range(INTERVALS)))
    i = _interval_of_n(1)
    state = MemoryGroupState(watermark=to_spark(500))
    rec = Record(1, {"n": 1}, 1_000, "r1")
    first = pd.concat(
        list(step((i,), iter([_frame([(RowKind.RECORD, encode_key(1), rec)])]), state))
    )
    assert "closed" not in set(first["stream"])
    assert _summary(first).next_low_watermark_timer == 1_000
    # a heartbeat below the timer; a tick with no watermark; and one at the timer that counts
    # this very batch as consumed (a rescale dropped it and planned it anew with the
    # heartbeat file written meanwhile): Spark's watermark applies that one, a batch later
    for frame in (
        _heartbeat(to_spark(999), upto=6),
        _heartbeat(None, now=5),
        _heartbeat(to_spark(1_000), upto=7),
    ):
        out = pd.concat(list(step((i,), iter([frame]), state)))
        assert "closed" not in set(out["stream"])
        assert _summary(out).low_watermark < 1_000
    # Spark's watermark still at 500: the heartbeat at 1,000 that counts batch 6 fires the timer
    out = pd.concat(list(step((i,), iter([_heartbeat(to_spark(1_000), upto=6)]), state)))
    assert [decode_value(v) for v in out[out["stream"] == "closed"]["value"]] == [1_000]
    done = _summary(out)
    assert done.low_watermark == 1_000 and done.hold is None
    # what is left to wake the key for is its record id's collection, which holds nothing
    assert done.next_low_watermark_timer == dedup_collect_at(1_000, 600_000, 60_000)


@pytest.mark.parametrize("jump", [10**9, "final"])
def test_records_arriving_as_the_watermark_jumps_past_their_ids_are_forgotten(
    step, monkeypatch, jump
):
    """A batch whose heartbeat raises the low watermark past a record's id horizon while it
    brings the record judges it against the watermark it arrived under: its id stays, and
    the summary says so (``judged``), so the driver still ticks the interval
    (``passed_since_run``: it ran under the new watermark) and the tick's run, with no
    records, forgets the key. At the final watermark (+inf) nothing can come after it but
    late, so the batch forgets the key itself (``dedup_horizon``): a drained run keeps
    nothing, and needs no batch of ticks for it."""
    import millwheel.runtime._interval as interval_mod
    from millwheel import MAX_TIMESTAMP
    from millwheel.runtime._wire import passed_since_run

    lw = MAX_TIMESTAMP if jump == "final" else jump
    monkeypatch.setattr(interval_mod, "task_batch_id", lambda: 7)  # the micro-batch running
    i = _interval_of_n(1)
    state = MemoryGroupState(watermark=to_spark(500))  # what the records arrived under
    rec = Record(1, {"n": 1}, 1_000, "r1")
    both = pd.concat(
        [_frame([(RowKind.RECORD, encode_key(1), rec)]), _heartbeat(to_spark(lw), upto=6)],
        ignore_index=True,
    )
    first = _summary(pd.concat(list(step((i,), iter([both]), state))))
    assert first.low_watermark == lw
    if jump == "final":
        assert first.keys == 0 and first.judged is None and first.next_low_watermark_timer is None
        assert not passed_since_run(first, lw)
        return
    assert first.judged == 500 and first.keys == 1
    assert first.next_low_watermark_timer == dedup_collect_at(1_000, 600_000, 60_000)
    assert passed_since_run(first, lw)  # without ``judged``: it ran under ``lw``, never ticked
    state.watermark = to_spark(lw)  # Spark's, a batch after the heartbeat it read
    tick = _summary(pd.concat(list(step((i,), iter([_heartbeat(None, now=5)]), state))))
    assert tick.keys == 0 and tick.judged is None and tick.next_low_watermark_timer is None
    assert not passed_since_run(tick, lw)
