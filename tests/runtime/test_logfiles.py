"""The log-file injector (MillWheel Fig. 10, Photon §3): growing files, offsets, watermark, dead letters.

The stream reader's offset logic runs on the driver without a JVM, so it is tested directly.
"""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest

from millwheel import DEAD_LETTER_STREAM, MAX_TIMESTAMP, MIN_TIMESTAMP, LogFileSource

pytest.importorskip("pyspark.sql.datasource")
from millwheel.runtime._logfiles import LogFileStreamReader  # noqa: E402


def _reader(path, **opts):
    src = LogFileSource(path, **opts)
    return LogFileStreamReader({**src.options(), "injector": "logs", "stream": "queries"})


def _rows(reader, start, end):
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            assert isinstance(batch, pa.RecordBatch)
            d = batch.to_pydict()
            out += [(s, i, t, pickle.loads(v)) for s, i, t, v in zip(d["stream"], d["id"], d["ts"], d["value"], strict=True)]
    return out


def _line(i, ts, q="cats"):
    return json.dumps({"id": f"e{i}", "ts": ts, "query": q}) + "\n"


def test_growing_files_new_files_and_the_oldest_unfinished_files_time(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    f1 = d / "queries_1000.jsonl"
    f1.write_text(_line(1, 1_100) + _line(2, 1_200) + '{"id": "e3", "ts": 13')  # the last line is still being written
    r = _reader(d)
    o0 = r.initialOffset()
    o1 = r.latestOffset(o0, None)
    assert o1["files"]["queries_1000.jsonl"][0] == len(_line(1, 1_100) + _line(2, 1_200))
    assert o1["lw"] == 1_000  # the only file is unfinished: its time
    assert [(s, i) for s, i, _, _ in _rows(r, o0, o1)] == [("queries", "e1"), ("queries", "e2")]

    with f1.open("a") as fh:
        fh.write("00}\n")  # completes line 3
    (d / "queries_2000.jsonl").write_text(_line(4, 2_100))
    (d / "queries_1000.jsonl.done").write_text("")
    o2 = r.latestOffset(o1, None)
    assert [i for _, i, _, _ in _rows(r, o1, o2)] == ["e3", "e4"]  # exactly the new bytes
    assert o2["lw"] == 2_000  # file 1 is finished and read: the oldest unfinished is file 2
    assert r.latestOffset(o2, None) == o2  # nothing new: same offset, no batch

    (d / "_DONE").write_text("")
    o3 = r.latestOffset(o2, None)
    assert o3["lw"] == MAX_TIMESTAMP and _rows(r, o2, o3) == []


def test_malformed_lines_go_to_dead_letters_with_reason_file_and_offset(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    lines = [_line(1, 1_100), "{broken\n", '{"id": "x", "query": "q"}\n', '{"id": "y", "ts": "soon"}\n', "[1, 2]\n", _line(2, 1_300)]
    (d / "queries_1000.jsonl").write_text("".join(lines))
    r = _reader(d, finite=True)
    o0 = r.initialOffset()
    o1 = r.latestOffset(o0, None)
    rows = _rows(r, o0, o1)
    good = [i for s, i, _, _ in rows if s == "queries"]
    dead = [v for s, _, _, v in rows if s == DEAD_LETTER_STREAM]
    assert good == ["e1", "e2"]
    assert [v["offset"] for v in dead] == [sum(len(x) for x in lines[:k]) for k in (1, 2, 3, 4)]
    assert {v["file"] for v in dead} == {"queries_1000.jsonl"}
    reasons = [v["reason"] for v in dead]
    assert reasons[0].startswith("broken JSON") and "missing timestamp" in reasons[1]
    assert "not an integer" in reasons[2] and "not a JSON object" in reasons[3]
    # dead-letter ids are deterministic (a replay re-publishes the same ids)
    assert [i for s, i, _, _ in rows if s == DEAD_LETTER_STREAM] == [i for s, i, _, _ in _rows(r, o0, o1) if s == DEAD_LETTER_STREAM]
    assert o1["lw"] == MAX_TIMESTAMP


def test_a_new_file_whose_time_is_unknown_holds_the_watermark(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.jsonl").write_text("")  # no time in the name, no line yet
    r = _reader(d)
    o1 = r.latestOffset(r.initialOffset(), None)
    assert o1["lw"] == MIN_TIMESTAMP
    (d / "a.jsonl").write_text(_line(1, 5_000))
    o2 = r.latestOffset(o1, None)
    assert o2["lw"] == 5_000  # the first line's timestamp is the file's time


def test_harness_batches_of_the_same_source(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "queries_1000.jsonl").write_text(_line(1, 1_100) + "oops\n")
    (d / "queries_2000.jsonl").write_text(_line(2, 2_100))
    src = LogFileSource(d, finite=True)
    batches = list(src.batches())
    assert [(len(b.records), b.low_watermark) for b in batches] == [(1, 2_000), (1, MAX_TIMESTAMP)]
    assert src.malformed[0]["file"] == "queries_1000.jsonl" and src.malformed[0]["offset"] == len(_line(1, 1_100))


def test_records_older_than_their_files_time_are_sent_late_however_files_are_batched(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "queries_1000.jsonl").write_text(_line(1, 1_100))
    (d / "queries_2000.jsonl").write_text(_line(2, 2_100) + _line(3, 1_500))  # e3 arrived after file 2 opened
    r = _reader(d, finite=True)
    o0 = r.initialOffset()
    o1 = r.latestOffset(o0, None)  # both files in one batch
    swm = {}
    for part in r.partitions(o0, o1):
        name, _, _, wm = part.value
        swm[name] = wm
    assert swm == {"queries_1000.jsonl": 1_000, "queries_2000.jsonl": 2_000}
    # so e3 (ts 1500 < 2000) is late, as when the files are delivered one at a time
