"""The JSON-lines log source (MillWheel §5.2, Fig. 10; Photon §3): file times from real names,
the reading plan both backends share (byte budget, finishing rules, a watermark that follows
read progress), lateness, dead letters. Pure: no Spark here (the Spark reader's rows are
checked in ``tests/runtime/test_logfiles.py``).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, LogFileSource, Stage, file_time
from millwheel._logfile import initial_offset, plan_offset, plan_ranges, read_range
from millwheel.testing import Harness

T = 1_767_261_600_000  # 2026-01-01T10:00:00Z


def _line(i, ts, q="cats"):
    return json.dumps({"id": f"e{i}", "ts": ts, "query": q}) + "\n"


def _plan(src, start=None, now=None):
    return plan_offset(
        start or initial_offset(), src.read_options, int(time.time() * 1000) if now is None else now
    )


def _records(src, start, end):
    out = []
    for r in plan_ranges(start, end, src.read_options.lateness_ms):
        out += read_range(src.read_options, r, "logs", "queries").records
    return [r.id for r in out]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("queries-1700000000000.jsonl", 1_700_000_000_000),
        ("queries_1700000000.log", 1_700_000_000_000),
        ("queries-2026-01-01.jsonl", 1_767_225_600_000),
        ("clicks-20260101.jsonl", 1_767_225_600_000),
        ("clicks-2026-01-01T10-30.jsonl", 1_767_263_400_000),
        ("x_2026-01-01_103015.ndjson", 1_767_263_415_000),
        ("part-0003.jsonl", None),
        ("queries.jsonl", None),
        ("host-12-2026-01-01.jsonl", 1_767_225_600_000),
    ],
)
def test_file_times_from_real_names_never_negative(name, expected):
    assert file_time(name) == expected


def test_the_watermark_follows_read_progress_and_rotation_finishes_files(tmp_path):
    f1 = tmp_path / f"queries-{T}.jsonl"
    f1.write_text(
        _line(1, T + 100) + _line(2, T + 200) + '{"id": "e3", "ts": 17'
    )  # last line still being written
    src = LogFileSource(tmp_path, idle_finish_ms=None)
    o1 = _plan(src)
    assert o1["files"][f1.name]["pos"] == len(_line(1, T + 100) + _line(2, T + 200))
    assert o1["lw"] == T + 200  # the newest record read, not the file's open time
    assert _records(src, initial_offset(), o1) == ["e1", "e2"]

    with f1.open("a") as fh:
        fh.write(str(T + 1_300)[2:] + "}\n")  # completes line 3
    f2 = tmp_path / f"queries-{T + 2_000}.jsonl"
    f2.write_text(_line(4, T + 2_100))
    o2 = _plan(src, o1)
    assert _records(src, o1, o2) == ["e3", "e4"]  # exactly the new bytes
    assert o2["files"][f1.name][
        "finished"
    ]  # read to the end and a newer file exists: rotated, finished
    assert o2["lw"] == T + 2_100
    assert _plan(src, o2) == o2  # nothing new: the same offset

    (tmp_path / "_DONE").write_text("")
    assert _plan(src, o2)["lw"] == MAX_TIMESTAMP


def test_without_rotation_an_unfinished_file_holds_and_idle_time_finishes_it(tmp_path):
    f1 = tmp_path / f"a-{T}.jsonl"
    f1.write_text(_line(1, T + 100))
    f2 = tmp_path / f"b-{T + 5_000}.jsonl"
    f2.write_text(_line(2, T + 5_100))
    src = LogFileSource(tmp_path, finish_on_rotation=False, idle_finish_ms=60_000, lateness_ms=50)
    o1 = _plan(src)
    assert o1["lw"] == T + 100 - 50  # file a is unfinished: it holds, minus the declared disorder
    later = int(os.stat(f1).st_mtime * 1000) + 61_000
    assert _plan(src, o1, now=later)["lw"] == T + 5_100 - 50  # idle for a minute: finished


def test_a_new_file_whose_time_is_unknown_holds_the_watermark(tmp_path):
    (tmp_path / "a.jsonl").write_text("")  # no time in the name, no line yet
    src = LogFileSource(tmp_path)
    o1 = _plan(src)
    assert o1["lw"] == MIN_TIMESTAMP
    (tmp_path / "a.jsonl").write_text(_line(1, 5_000))
    assert _plan(src, o1)["lw"] == 5_000  # the first line's timestamp is the file's time


def test_the_byte_budget_is_exact(tmp_path):
    lines = [_line(i, T + i) for i in range(6)]
    (tmp_path / f"a-{T}.jsonl").write_text("".join(lines[:3]))
    (tmp_path / f"b-{T + 10}.jsonl").write_text("".join(lines[3:]))
    n = len(lines[0])
    src = LogFileSource(tmp_path, finite=True, max_bytes_per_batch=2 * n + n // 2)
    o1 = _plan(src)
    assert _records(src, initial_offset(), o1) == ["e0", "e1"]  # the third line does not fit
    o2 = _plan(src, o1)
    assert _records(src, o1, o2) == ["e2", "e3"]  # never the whole next file
    tiny = LogFileSource(tmp_path, finite=True, max_bytes_per_batch=5)
    assert _records(tiny, initial_offset(), _plan(tiny)) == [
        "e0"
    ]  # one line longer than the budget


def test_records_older_than_their_files_time_are_late_however_files_are_batched(tmp_path):
    (tmp_path / f"q-{T}.jsonl").write_text(_line(1, T + 100))
    (tmp_path / f"q-{T + 1_000}.jsonl").write_text(
        _line(2, T + 1_100) + _line(3, T + 500)
    )  # e3: after file 2 opened
    src = LogFileSource(tmp_path, finite=True)
    o1 = _plan(src)  # both files in one batch
    swm = {r.name: r.sender_watermark for r in plan_ranges(initial_offset(), o1, 0)}
    assert swm == {f"q-{T}.jsonl": T, f"q-{T + 1_000}.jsonl": T + 1_000}
    # in memory, the same: file 2's records are sent under its time, so e3 is late
    batches = [(b.low_watermark, [r.id for r in b.records]) for b in src.batches()]
    assert (T + 1_000, ["e2", "e3"]) in batches


def test_malformed_lines_are_dead_letters_with_reason_file_offset_and_the_files_time(tmp_path):
    lines = [
        _line(1, T + 1),
        "{broken\n",
        '{"id": "x", "query": "q"}\n',
        '{"id": "y", "ts": "soon"}\n',
        "[1, 2]\n",
        '{"id": 7, "ts": 5}\n',
        json.dumps({"id": "z", "ts": 2**70}) + "\n",
        _line(2, T + 3),
    ]
    (tmp_path / f"q-{T}.jsonl").write_text("".join(lines))
    src = LogFileSource(tmp_path, finite=True)
    dead = [d for b in src.batches() for d in b.dead_letters]
    records = [r.id for b in src.batches() for r in b.records]
    assert records == ["e1", "e2"]
    assert [d.value.offset for d in dead] == [sum(len(x) for x in lines[:k]) for k in range(1, 7)]
    assert {(d.value.stage, d.value.file, d.timestamp) for d in dead} == {
        (Stage.MALFORMED, f"q-{T}.jsonl", T)
    }
    reasons = [d.value.reason for d in dead]
    assert reasons[0].startswith("broken JSON") and "missing timestamp" in reasons[1]
    assert "not an integer" in reasons[2] and "not a JSON object" in reasons[3]
    assert "non-empty string, got int" in reasons[4] and "64-bit" in reasons[5]
    assert [d.id for d in dead] == [
        d.id for b in src.batches() for d in b.dead_letters
    ]  # deterministic ids
    assert len({d.id for d in dead}) == len(dead)


def test_a_file_cut_by_the_byte_budget_promises_only_its_time(tmp_path):
    """Records shuffled inside a replayed file are never late because of where a batch
    stopped in it: progress counts only once the reader is at the file's end."""
    lines = [_line(i, T + ts) for i, ts in enumerate([900, 100, 800, 200, 700, 300])]
    (tmp_path / f"a-{T}.jsonl").write_text("".join(lines))
    src = LogFileSource(tmp_path, idle_finish_ms=None, max_bytes_per_batch=3 * len(lines[0]))
    o1 = _plan(src)
    assert o1["lw"] == T  # cut after e2 (ts T+800): the rest may be older
    o2 = _plan(src, o1)
    assert o2["lw"] == T + 300  # at the end of a live file: its newest line
    # one line per batch: every record is sent under a watermark it is not behind
    batches = list(
        LogFileSource(tmp_path, finite=True, max_bytes_per_batch=len(lines[0])).batches()
    )
    sent = [(r.timestamp, b.low_watermark) for b in batches for r in b.records]
    assert len(sent) == 6 and all(ts >= wm for ts, wm in sent), sent


def test_finished_part_files_with_cross_file_disorder_lose_nothing_with_defaults(
    tmp_path, real_logs, second_counts
):
    # names without times; each file's records run up to 5 s behind the previous file's
    # newest: a finished file's promise is its smallest timestamp, so none is late
    truth, _ = real_logs(tmp_path / "logs", events=20_000, files=8, disorder_ms=5_000)
    h = Harness(
        second_counts(LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts", finite=True)),
        raise_errors=False,
    )
    h.run_sources()
    assert h.metrics("SecondCounts")["late"] == 0
    assert second_counts.answer(h.output("counts")) == truth
    assert h.metrics("SecondCounts")["duplicates"] > 100  # the retries were there, and deduplicated


def test_the_watermark_still_moves_file_by_file_through_a_backlog_of_named_files(
    tmp_path, real_logs
):
    real_logs(
        tmp_path, events=2_000, files=4, disorder_ms=0, names="events-2026-01-01T10-0{}.jsonl"
    )
    src = LogFileSource(tmp_path, finite=True, max_bytes_per_batch=20_000)
    marks = [b.low_watermark for b in src.batches()]
    assert len(set(marks)) > 4 and marks == sorted(marks)


def test_an_unread_file_without_a_time_holds_the_watermark_and_a_partly_read_one_too(
    tmp_path, real_logs
):
    real_logs(tmp_path, events=4_000, files=3, disorder_ms=5_000)
    src = LogFileSource(
        tmp_path, finite=True, max_bytes_per_batch=50_000
    )  # several batches per file
    o = initial_offset()
    while o["lw"] < MAX_TIMESTAMP:
        nxt = _plan(src, o)
        unread = [n for n, f in nxt["files"].items() if not f["finished"]]
        if unread:
            assert nxt["lw"] == MIN_TIMESTAMP  # what is left in a file nobody has read is unknown
        o = nxt
    # and in memory the whole directory counts exactly however it was batched
    batches = list(src.batches())
    late = [r for b in batches for r in b.records if r.timestamp < b.low_watermark]
    assert late == []


def test_a_growing_file_without_a_time_promises_its_oldest_record(
    tmp_path, real_logs, second_counts
):
    # a live log tailed while it is written: appended in chunks, the reader caught up after
    # each; with no declared disorder the file holds the watermark at its oldest record, so
    # nothing it goes on to write is late; once finished, every count is exact
    truth, lines = real_logs(tmp_path, events=6_000, disorder_ms=5_000, only_lines=True)
    log = tmp_path / "logs" / "events.jsonl"
    log.parent.mkdir()
    log.write_text("")
    src = LogFileSource(log.parent, idle_finish_ms=None)
    h = Harness(second_counts(src), raise_errors=False)
    o = initial_offset()
    chunk = len(lines) // 6
    for i in range(7):
        with log.open("a") as fh:
            fh.write("".join(x + "\n" for x in lines[i * chunk : (i + 1) * chunk]))
        if i == 6:
            (log.parent / "_DONE").write_text("")
        end = _plan(src, o)
        for r in plan_ranges(o, end, 0):
            chunk_read = read_range(src.read_options, r, "logs", "events")
            h.advance_watermark("logs", r.sender_watermark)
            h.inject("logs", chunk_read.records)
            h.run()
        h.advance_watermark("logs", end["lw"])
        h.run()
        if i < 6:
            written = [
                json.loads(x)["ts"]
                for x in lines[: (i + 1) * chunk]
                if not x.startswith('{"id": "broken')
            ]
            assert end["lw"] == min(
                written
            )  # held at the oldest record read, not the first or newest
        o = end
    assert o["lw"] == MAX_TIMESTAMP
    assert h.metrics("SecondCounts")["late"] == 0
    assert second_counts.answer(h.output("counts")) == truth
