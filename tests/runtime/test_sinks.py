"""Outputs people can read: sink targets (JSON lines, Parquet, CSV) and ``millwheel read``.

The sink writer follows a stream log; these tests drive it with files published the way
the outbox publishes committed batches (``FileStreamLog.append``), so no Spark is needed.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from millwheel import (
    DEAD_LETTER_STREAM,
    Computation,
    DeadLetter,
    MillwheelError,
    Record,
    SampleSource,
    Topology,
)
from millwheel.cli import main
from millwheel.runtime._fs import Location
from millwheel.runtime._sinks import SinkWriter, parse_target, read_main, sink_targets
from millwheel.runtime._streams import FileStreamLog


class Echo(Computation):
    def process_record(self, record):
        self.produce("echoes", {"word": record.value["word"], "n": len(record.value["word"])})


def _topology(target, stream="echoes"):
    t = Topology("sinks")
    t.injector(
        "words", SampleSource([{"word": "hi", "ts": 1}, {"word": "hello", "ts": 2}], timestamp="ts")
    )
    t.computation(Echo, inputs={"words": lambda r: r.value["word"]}, outputs=["echoes"])
    t.sink(stream, target)
    return t


def _log(root) -> FileStreamLog:
    streams = FileStreamLog(Location.of(str(root)))
    streams.ensure("echoes", "Echo")
    return streams


def _records(n, start=0):
    return [
        Record(("k", i), {"i": i, "vals": (1, 2)}, 1_000 + i, f"r{i}")
        for i in range(start, start + n)
    ]


def _writer(tmp_path, target, root=None):
    t = _topology(target)
    ((spec, parsed),) = sink_targets(t).values()
    root = root or tmp_path / "run"
    return SinkWriter(spec, parsed, _log(root), Location.of(str(root)))


@pytest.mark.parametrize(
    ("target", "fmt"),
    [
        ("out/x.jsonl", "jsonl"),
        ("out/x.ndjson/", "jsonl"),
        ("out/x.parquet", "parquet"),
        ("out/x.csv", "csv"),
        ("parquet:/data/x", "parquet"),
    ],
)
def test_the_format_comes_from_the_target(target, fmt):
    assert parse_target(target).format == fmt


def test_a_target_without_a_format_is_refused_with_the_fix():
    with pytest.raises(
        MillwheelError,
        match=r"sink 'sink.echoes' of stream 'echoes'.*end it in .jsonl, .parquet or .csv",
    ):
        sink_targets(_topology("out/echoes"))
    with pytest.raises(MillwheelError, match="is not a path"):
        sink_targets(_topology(42))


def test_committed_files_are_written_once_as_plain_json_lines(tmp_path):
    w = _writer(tmp_path, str(tmp_path / "out" / "echoes.jsonl"))
    w.start()
    w.streams.append("echoes", "Echo", "b0000000001-part-0", _records(3))
    assert w.poll() == 1
    assert w.poll() == 0  # nothing new: nothing written again
    w.streams.append("echoes", "Echo", "b0000000002-part-0", _records(2, start=3))
    assert w.poll() == 1
    rows = [
        json.loads(line)
        for f in sorted((tmp_path / "out" / "echoes.jsonl").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert [r["id"] for r in rows] == ["r0", "r1", "r2", "r3", "r4"]
    assert rows[0] == {"id": "r0", "ts": 1_000, "key": ["k", 0], "value": {"i": 0, "vals": [1, 2]}}
    again = _writer(tmp_path, str(tmp_path / "out" / "echoes.jsonl"))  # a restarted driver
    again.start()
    assert again.poll() == 0


def test_parquet_and_csv_targets_are_read_by_pandas(tmp_path):
    for fmt in ("parquet", "csv"):
        w = _writer(tmp_path, str(tmp_path / "out" / f"echoes.{fmt}"))
        w.start()
        if fmt == "parquet":
            w.streams.append("echoes", "Echo", "b0000000001-part-0", _records(3))
        w.poll()
        d = tmp_path / "out" / f"echoes.{fmt}"
        df = (
            pd.read_parquet(d)
            if fmt == "parquet"
            else pd.concat(pd.read_csv(f) for f in d.glob("*.csv"))
        )
        assert list(df.columns) == ["id", "ts", "key", "value"]
        assert sorted(df["id"]) == ["r0", "r1", "r2"]
        assert json.loads(df.sort_values("id")["value"].iloc[0]) == {"i": 0, "vals": [1, 2]}
        assert df.sort_values("id")["key"].iloc[0] == '["k", 0]'


def test_a_target_holding_another_runs_output_is_refused_and_a_fresh_run_replaces_its_own(tmp_path):
    target = str(tmp_path / "out" / "echoes.jsonl")
    w = _writer(tmp_path, target)
    w.start()
    w.streams.append("echoes", "Echo", "b0000000001-part-0", _records(1))
    w.poll()
    other = _writer(tmp_path, target, root=tmp_path / "other-run")
    with pytest.raises(MillwheelError, match="holds the output of another run"):
        other.start()
    (tmp_path / "run" / "run_id").unlink()  # what --fresh does: a new run in the same run directory
    fresh = _writer(tmp_path, target)
    fresh.start()
    assert not list((tmp_path / "out" / "echoes.jsonl").glob("*.jsonl"))


def test_the_harness_backend_writes_the_target_too(tmp_path, capsys):
    path = tmp_path / "topo.py"
    path.write_text(
        "from millwheel import Computation, SampleSource, Topology\n"
        "class Echo(Computation):\n"
        "    def process_record(self, record):\n"
        "        self.produce('echoes', record.value['word'].upper())\n"
        "topology = Topology('echo')\n"
        "topology.injector('words', SampleSource([{'word': 'hi', 'ts': 1}, {'word': 'ho', 'ts': 2}], timestamp='ts'))\n"
        "topology.computation(Echo, inputs={'words': lambda r: r.value['word']}, outputs=['echoes'])\n"
        f"topology.sink('echoes', {str(tmp_path / 'out' / 'echoes.jsonl')!r})\n"
    )
    assert main(["run", "--backend", "harness", str(path)]) == 0
    assert "sink echoes: 2 records; written to" in capsys.readouterr().out
    rows = [
        json.loads(line)
        for line in (tmp_path / "out" / "echoes.jsonl" / "harness-part-0.jsonl")
        .read_text()
        .splitlines()
    ]
    assert sorted(r["value"] for r in rows) == ["HI", "HO"]


def test_millwheel_read_prints_any_stream_dead_letters_included(tmp_path, capsys):
    root = tmp_path / "run"
    streams = _log(root)
    streams.append("echoes", "Echo", "b0000000001-part-0", _records(3))
    letter = DeadLetter("key_extractor", "KeyError: 'word'", computation="Echo", stream="words")
    streams.ensure(DEAD_LETTER_STREAM, "Echo")
    streams.append(
        DEAD_LETTER_STREAM, "Echo", "b0000000001-part-0", [Record(None, letter, 5, "d1")]
    )
    assert main(["read", str(root)]) == 0
    listing = capsys.readouterr().out
    assert "echoes" in listing and "3 records" in listing and "dead_letters" in listing
    assert read_main([str(root), "echoes", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["r0", "r1"]
    assert read_main([str(root), DEAD_LETTER_STREAM]) == 0
    dead = json.loads(capsys.readouterr().out)
    assert (
        dead["value"]["reason"] == "KeyError: 'word'" and dead["value"]["stage"] == "key_extractor"
    )
    assert read_main([str(root), "echoes", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "id,ts,key,value"
    out = tmp_path / "echoes.parquet"
    assert read_main([str(root), "echoes", "--format", "parquet", "--out", str(out)]) == 0
    assert len(pd.read_parquet(out)) == 3


def test_millwheel_read_says_what_is_wrong(tmp_path, capsys):
    assert read_main([str(tmp_path)]) == 2
    assert "is not a millwheel run directory" in capsys.readouterr().err
    root = tmp_path / "run"
    _log(root)
    assert read_main([str(root), "echos"]) == 2
    assert "has no stream 'echos'; its streams: echoes" in capsys.readouterr().err
