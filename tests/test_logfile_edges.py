"""Log files at the edges of bytes and time (issue 36, observations 1 and 2), on the shared
reading plan both backends run: every byte is accounted for, and an implausible timestamp
moves no time. Pure: the Spark side is ``tests/runtime/test_logfiles.py`` and the campaign
``tests/test_bad_input_campaign.py``.
"""

from __future__ import annotations

import json
import time

from hypothesis import given
from hypothesis import strategies as st

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, LogFileSource, Stage
from millwheel._logfile import disorder, initial_offset, plan_offset, plan_ranges, read_range
from millwheel._record import duration_text, timestamp_text, utc_text
from millwheel.runtime._runtime import lag_text
from millwheel.testing import Harness

T = 1_767_261_600_000  # 2026-01-01T10:00:00Z
NAME = "queries-2026-01-01T10-00.jsonl"


def _line(i, ts, key="k"):
    return json.dumps({"id": f"e{i}", "ts": ts, "key": key}) + "\n"


def _plan(src, start=None, now=None):
    return plan_offset(
        start or initial_offset(), src.read_options, int(time.time() * 1000) if now is None else now
    )


def _read(src, start, end):
    """The records and dead letters of the batch from ``start`` to ``end``."""
    records, dead = [], []
    for r in plan_ranges(start, end, src.read_options.lateness_ms):
        chunk = read_range(src.read_options, r, "logs", "events")
        records += chunk.records
        dead += chunk.dead_letters
    return records, dead


# ---- observation 1: every byte is accounted for ------------------------------------------
def test_a_finished_directory_reads_a_last_line_without_a_newline(tmp_path, second_counts):
    # many writers end a file without "\n": the file was never finished, the directory's
    # promise stayed at its start and the harness ended with 0 of its output and no word
    (tmp_path / "part-0000.jsonl").write_text(
        "".join(_line(i, T + i * 10) for i in range(50)) + _line(50, T + 500)[:-1]
    )
    (tmp_path / "part-0001.jsonl").write_text(
        "".join(_line(100 + i, T + 600 + i * 10, "j") for i in range(20))
    )
    h = Harness(second_counts(LogFileSource(tmp_path, finite=True)), raise_errors=False)
    h.run_sources()
    assert h.low_watermark("SecondCounts") == MAX_TIMESTAMP
    assert second_counts.answer(h.output("counts")) == {("k", T): 51, ("j", T): 20}
    assert h.dead_letters() == []


def test_a_half_line_waits_while_its_file_grows_and_is_read_once_it_is_finished(tmp_path):
    log = tmp_path / NAME
    log.write_text(_line(1, T + 1) + _line(2, T + 2)[:20])  # the writer is in the middle of line 2
    src = LogFileSource(tmp_path, idle_finish_ms=None)
    o1 = _plan(src)
    records, dead = _read(src, initial_offset(), o1)
    assert [r.id for r in records] == ["e1"] and dead == []
    assert _plan(src, o1) == o1  # the half line waits
    with log.open("a") as fh:
        fh.write(
            _line(2, T + 2)[20:] + _line(3, T + 3)[:-1]
        )  # line 2 done; line 3 without its newline
    o2 = _plan(src, o1)
    assert [r.id for r in _read(src, o1, o2)[0]] == ["e2"]
    assert not o2["files"][NAME]["finished"]
    # the stall warning's advice, followed: a .done marker finishes the file, and its last
    # line is read although it has no newline
    (tmp_path / f"{NAME}.done").write_text("")
    o3 = _plan(src, o2)
    assert [r.id for r in _read(src, o2, o3)[0]] == ["e3"]
    assert o3["files"][NAME]["finished"] and o3["files"][NAME]["pos"] == log.stat().st_size


def test_a_rotated_files_half_line_waits_for_its_writer_and_idle_time_reads_it(tmp_path):
    # a newer file says the old one is complete, but its writer may still be finishing
    # the last line: that waits for a marker or idle time, not for rotation alone
    old, new = tmp_path / f"q-{T}.jsonl", tmp_path / f"q-{T + 60_000}.jsonl"
    old.write_text(_line(1, T + 1) + _line(2, T + 2)[:10])
    new.write_text(_line(3, T + 60_001))
    src = LogFileSource(tmp_path, idle_finish_ms=60_000)
    now = int(old.stat().st_mtime * 1000) + 1_000
    o1 = _plan(src, now=now)
    assert [r.id for r in _read(src, initial_offset(), o1)[0]] == ["e1", "e3"]
    assert not o1["files"][old.name]["finished"]
    with old.open("a") as fh:
        fh.write(_line(2, T + 2)[10:] + _line(4, T + 4)[:-1])
    o2 = _plan(src, o1, now=now)
    assert [r.id for r in _read(src, o1, o2)[0]] == ["e2"]
    o3 = _plan(src, o2, now=int(old.stat().st_mtime * 1000) + 61_000)  # idle for a minute
    assert [r.id for r in _read(src, o2, o3)[0]] == ["e4"] and o3["files"][old.name]["finished"]


def test_a_half_line_that_stays_half_is_a_dead_letter_with_its_file_and_offset(tmp_path):
    good = _line(1, T + 1)
    (tmp_path / NAME).write_text(good + '{"id": "e2", "ts": 17672')
    (tmp_path / "_DONE").write_text("")  # the advice's other marker: the directory is complete
    src = LogFileSource(tmp_path, idle_finish_ms=None)
    end = _plan(src)
    records, dead = _read(src, initial_offset(), end)
    assert [r.id for r in records] == ["e1"]
    (letter,) = [d.value for d in dead]
    assert (letter.stage, letter.file, letter.offset) == (Stage.MALFORMED, NAME, len(good))
    assert letter.reason.startswith("broken JSON")
    assert end["lw"] == MAX_TIMESTAMP


# ---- observation 2: implausible time does not move time -----------------------------------
def test_a_microsecond_timestamp_at_the_read_position_of_a_tailed_file_moves_no_time(
    tmp_path, second_counts
):
    # one record in microseconds at the read position of a time-named file being tailed: the
    # watermark jumped to the year 57971 and half of what followed was dropped as late
    log = tmp_path / NAME
    src = LogFileSource(tmp_path, idle_finish_ms=None)
    h = Harness(second_counts(src), raise_errors=False)
    bad = (T + 2_000_000) * 1000
    writes = [
        "".join(_line(i, T + i * 1_000) for i in range(2_000)),
        json.dumps({"id": "us", "ts": bad, "key": "k"}) + "\n",
        "".join(_line(i, T + i * 1_000) for i in range(2_000, 4_000)),
    ]
    o, dead = initial_offset(), []
    log.write_text("")
    for i, text in enumerate(writes):
        with log.open("a") as fh:
            fh.write(text)
        if i == len(writes) - 1:
            (tmp_path / "_DONE").write_text("")
        end = _plan(src, o)
        for r in plan_ranges(o, end, 0):
            chunk = read_range(src.read_options, r, "logs", "events")
            h.advance_watermark("logs", r.sender_watermark)
            h.inject("logs", chunk.records)
            dead += chunk.dead_letters
            h.run()
        assert end["lw"] <= T + 4_000 * 1_000 or end["lw"] == MAX_TIMESTAMP, timestamp_text(
            end["lw"]
        )  # never the bad record's
        h.advance_watermark("logs", end["lw"])
        h.run()
        o = end
    assert o["lw"] == MAX_TIMESTAMP
    assert disorder(o) is None  # in order: no advice of lateness_ms=1765458394380000
    assert h.metrics("SecondCounts")["late"] == 0
    assert sum(second_counts.answer(h.output("counts")).values()) == 4_000
    (letter,) = [d.value for d in dead]
    assert (letter.stage, letter.file, letter.record.timestamp) == (
        Stage.IMPLAUSIBLE_TIMESTAMP,
        NAME,
        bad,
    )
    assert str(bad) in letter.reason


def test_unit_mistakes_are_implausible_by_default(tmp_path):
    lines = [
        _line(0, T),
        _line(1, T // 1000),
        _line(2, T * 1000),
        _line(3, T * 1_000_000),
        _line(4, T + 5),
    ]
    (tmp_path / NAME).write_text("".join(lines))
    src = LogFileSource(tmp_path, finite=True)
    batches = list(src.batches())
    assert [r.id for b in batches for r in b.records] == ["e0", "e4"]
    dead = [d.value for b in batches for d in b.dead_letters]
    assert [d.stage for d in dead] == [Stage.IMPLAUSIBLE_TIMESTAMP] * 3
    assert [d.record.timestamp for d in dead] == [T // 1000, T * 1000, T * 1_000_000]
    assert [d.offset for d in dead] == [sum(map(len, lines[:k])) for k in (1, 2, 3)]
    assert all(str(d.record.timestamp) in d.reason for d in dead)
    assert all(b.low_watermark <= T + 5 or b.low_watermark == MAX_TIMESTAMP for b in batches)


# ---- no formatter fails on any int64 timestamp ---------------------------------------------
@given(st.integers(MIN_TIMESTAMP, MAX_TIMESTAMP))
def test_every_time_formatter_spells_every_int64(v):
    # the driver died formatting its status line: "ValueError: year 57971 is out of range"
    from millwheel import Computation, Topology
    from millwheel._runner import late_lines
    from millwheel.runtime._status import Row, Snapshot, _decision_text, compact_line, table_lines

    assert timestamp_text(v) and utc_text(v) and utc_text(v, "%H:%M:%S")
    assert duration_text(v) and lag_text(v, now_ms=T)
    assert _decision_text({"action": "split", "from": 2, "to": 4, "at_ms": v, "reason": "hot"})
    row = Row("C", "computation", 1, 1, 0, 0, 0, v, lag_ms=v, event_lag_ms=v, disorder_ms=v)
    snapshot = Snapshot(1.0, v, (row, Row("logs", "injector", None, 1, 0, None, None, v)))
    assert table_lines(snapshot) and compact_line(snapshot)

    class C(Computation):
        def process_record(self, record): ...

    t = Topology("t")
    t.injector("logs", stream="events")
    t.computation(C, inputs=["events"])
    assert late_lines(
        t, {"C": {"records_in": 10, "late": 1, "late_dropped": 1}}, {"logs": (abs(v), "f.jsonl")}
    )
