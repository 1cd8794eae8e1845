"""The live status of ``millwheel run``: snapshots, the table, the log line, the displays."""

from __future__ import annotations

import io

import pytest

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, Computation, SampleSource, Topology
from millwheel.runtime._cli import _report
from millwheel.runtime._status import (
    LiveTable,
    LogLines,
    Row,
    Sampler,
    Silent,
    Snapshot,
    compact_line,
    display_for,
    table_lines,
)

T0 = 1_700_000_000_000


class FakeRuntime:
    """What the sampler reads: ``status()``, and queries without Spark progress."""

    def __init__(self) -> None:
        self.computations: dict = {}
        self.injectors: dict = {}
        self.rows = {
            "queries": {
                "kind": "injector",
                "records_out": 100,
                "dead_letters": 2,
                "low_watermark": T0 - 1_000,
                "newest_event_ms": T0,
            },
            "Counter": {
                "kind": "computation",
                "records_in": 90,
                "productions": 9,
                "dead_letters": 0,
                "duplicates": 4,
                "late": 1,
                "timers_fired": 9,
                "low_watermark": T0 - 3_000,
                "batches": 5,
            },
        }

    def status(self):
        return {k: dict(v) for k, v in self.rows.items()}


def test_rates_lags_and_counts_come_from_the_runtime_status():
    rt = FakeRuntime()
    sampler = Sampler(rt)
    first = sampler.sample()
    rows = {r.name: r for r in first.rows}
    assert rows["Counter"].in_rate is None  # no earlier snapshot
    assert rows["Counter"].event_lag_ms == 3_000  # newest event time read - computation watermark
    assert rows["queries"].event_lag_ms is None
    assert rows["Counter"].lag_ms is not None and rows["Counter"].lag_ms > 0
    rt.rows["Counter"]["records_in"] = 190
    rt.rows["queries"]["records_out"] = 300
    rows = {r.name: r for r in sampler.sample().rows}
    assert rows["Counter"].in_rate > 0 and rows["queries"].out_rate > 0
    assert rows["Counter"].duplicates == 4 and rows["Counter"].late == 1


def test_lags_are_unknown_before_anything_is_known_and_after_the_end():
    rt = FakeRuntime()
    rt.rows["queries"]["low_watermark"] = MAX_TIMESTAMP
    rows = {r.name: r for r in Sampler(rt).sample().rows}
    assert rows["queries"].lag_ms is None
    assert (
        rows["Counter"].event_lag_ms == 3_000
    )  # the inputs are finished: still behind their newest record
    rt.rows["Counter"]["low_watermark"] = MIN_TIMESTAMP
    rows = {r.name: r for r in Sampler(rt).sample().rows}
    assert rows["Counter"].lag_ms is None and rows["Counter"].event_lag_ms is None
    rt.rows["Counter"]["low_watermark"] = MAX_TIMESTAMP
    rt.rows["queries"]["newest_event_ms"] = None
    rows = {r.name: r for r in Sampler(rt).sample().rows}
    assert rows["Counter"].lag_ms is None and rows["Counter"].event_lag_ms is None


def test_the_table_shows_duplicates_late_records_dates_and_warnings():
    rt = FakeRuntime()
    rt.rows["queries"]["warning"] = (
        "injector queries: low watermark unchanged for 61s, held by 'a.jsonl'"
    )
    lines = table_lines(Sampler(rt).sample())
    header = lines[0]
    for title in ("late", "dup", "dead", "low watermark (UTC)", "lag", "lag (inputs)"):
        assert title in header
    counter = next(line for line in lines if line.startswith("Counter"))
    assert "2023-11-14 22:13:17" in counter  # a date, not just a time of day
    assert " 4 " in counter and " 1 " in counter and "3.0s" in counter
    assert lines[-1].startswith("warning: injector queries: low watermark unchanged")


def test_a_replay_of_old_data_lags_days_behind_wall_time_but_seconds_behind_its_inputs():
    snap = Snapshot(
        10.0,
        T0 + 95_000_000_000,
        (Row("C", "computation", 1, 0, 0, 0, 0, T0, lag_ms=95_000_000_000, event_lag_ms=2_500),),
    )
    line = table_lines(snap)[1]
    assert "1099.5d" in line and "2.5s" in line


def test_the_log_line_is_one_compact_line_with_only_nonzero_problems():
    rt = FakeRuntime()
    line = compact_line(Sampler(rt).sample())
    assert "\n" not in line
    assert "queries out=100" in line and "dead=2" in line
    assert "Counter in=90 out=9 lag_in=3.0s dup=4 late=1" in line


def test_the_live_table_is_redrawn_in_place():
    out = io.StringIO()
    table = LiveTable(out, title="demo")
    sampler = Sampler(FakeRuntime())
    table.show(sampler.sample())
    first = out.getvalue()
    assert first.startswith("\r\x1b[J") and "demo" in first
    drawn = first.count("\n")
    table.show(sampler.sample())
    second = out.getvalue()[len(first) :]
    assert second.startswith(
        f"\x1b[{drawn}F\x1b[J"
    )  # back to the table's first line, clear, redraw
    table.message("millwheel: a restart")
    third = out.getvalue()[len(first) + len(second) :]
    assert third.startswith(f"\x1b[{drawn}F\x1b[J") and "millwheel: a restart\n" in third
    assert third.index("millwheel: a restart") < third.index(
        "demo"
    )  # the table follows the message


def test_log_lines_print_a_warning_once_and_quiet_prints_nothing():
    out = io.StringIO()
    display = LogLines(out)
    rt = FakeRuntime()
    rt.rows["queries"]["warning"] = "stalled"
    sampler = Sampler(rt)
    display.show(sampler.sample())
    display.show(sampler.sample())
    assert out.getvalue().count("warning: stalled") == 1
    assert out.getvalue().count("queries out=100") == 2
    assert isinstance(display_for(quiet=True), Silent)
    assert isinstance(display_for(quiet=False, out=io.StringIO()), LogLines)  # not a terminal
    assert isinstance(display_for(quiet=False, out=io.StringIO(), interactive=True), LiveTable)


class _Count(Computation):
    def process_record(self, record):
        pass


def _late_run() -> tuple[FakeRuntime, dict]:
    """A run whose computation dropped 30 of its 600 records as late, from a log injector that read them 3 s out of order."""
    topology = Topology("late")
    topology.injector("queries", SampleSource([{"q": "cats", "ts": 1}], timestamp="ts"))
    topology.computation(_Count, name="Counter", inputs={"queries": lambda r: r.value["q"]})
    rt = FakeRuntime()
    rt.topology = topology  # type: ignore[attr-defined]
    counters = {"records_in": 600, "late": 30, "late_dropped": 30, "late_to_stream": 0}
    rt.rows["Counter"].update(records_in=600, late=30, counters=counters)
    rt.rows["queries"].update(disorder_ms=3_000, disorder_file="events-2026-01-01T10-00-30.jsonl")
    return rt, {"Counter": counters}


WARNING = (
    "warning: Counter: 30 records late (5.00% of 600), 30 dropped; injector queries read records up to 3.0s out of order "
    "(events-2026-01-01T10-00-30.jsonl): LogFileSource(lateness_ms=3000) would have kept them"
)


def test_the_live_status_warns_of_late_records_with_what_became_of_them_and_the_fix():
    rt, _ = _late_run()
    rt.rows["queries"]["warning"] = "stalled"
    lines = table_lines(Sampler(rt).sample())
    assert lines[-2:] == ["warning: stalled", WARNING]


def test_the_end_of_a_run_says_its_late_records_once(tmp_path, capsys):
    rt, metrics = _late_run()
    rt.rows["queries"]["warning"] = "stalled"
    _report(
        rt.topology,
        str(tmp_path),
        Sampler(rt).sample(),
        metrics,
        None,
        "topology late: ran on Spark in 1.0s",
    )  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert out.count("records late") == 1, (
        out
    )  # the final table leaves it to the summary, which says it as the harness's run does
    assert f"  {WARNING}\n" in out and "  warning: stalled\n" in out


def test_the_final_report_and_finished_json_keep_what_the_injectors_left_out_or_could_not_dedup(
    tmp_path, capsys
):
    """A log injector's records without an id (``<file>:<offset>`` ids, no dedup of their copies)
    and a ``SparkSource``'s rows at or after ``end_ms``: in the status, the final report, and
    ``finished.json``, whose report a second ``millwheel run`` prints without Spark."""
    import argparse
    import json

    from millwheel import LogFileSource, SparkSource
    from millwheel.runtime._cli import FINISHED, _save_finished, run

    topology = Topology("edges")
    topology.injector("logs", LogFileSource(str(tmp_path / "logs"), finite=True), stream="events")
    topology.injector("clicks", SparkSource(rows=[], timestamp="ts", end_ms=T0), stream="clicks")
    topology.computation(
        _Count,
        name="Counter",
        inputs={"events": lambda r: r.value["q"], "clicks": lambda r: r.value["q"]},
    )
    rt = FakeRuntime()
    rt.topology = topology  # type: ignore[attr-defined]
    rt.rows = {
        "logs": {
            "kind": "injector",
            "records_out": 10,
            "dead_letters": 0,
            "low_watermark": MAX_TIMESTAMP,
            "positional_ids": 3,
        },
        "clicks": {
            "kind": "injector",
            "records_out": 7,
            "dead_letters": 0,
            "low_watermark": MAX_TIMESTAMP,
            "beyond_end": 5,
        },
        "Counter": {
            "kind": "computation",
            "records_in": 17,
            "productions": 0,
            "dead_letters": 0,
            "low_watermark": MAX_TIMESTAMP,
        },
    }
    snapshot = Sampler(rt).sample()
    assert [(r.positional_ids, r.beyond_end) for r in snapshot.rows] == [
        (3, None),
        (None, 5),
        (None, None),
    ]
    root = tmp_path / "run"
    root.mkdir()
    _report(
        topology, str(root), snapshot, {"Counter": {}}, None, "topology edges: ran on Spark in 1.0s"
    )
    said = capsys.readouterr().out
    positional = "warning: injector logs: 3 records had no 'id' field and got their file and byte offset as id (<file>:<offset>)"
    beyond = f"injector clicks: 5 rows at or after its end_ms={T0} (2023-11-14 22:13:20) left out: not part of the input"
    assert positional in said and beyond in said, said
    _save_finished(str(root), topology, (), snapshot, {"Counter": {}}, 1.0)
    rows = {r["name"]: r for r in json.loads((root / FINISHED).read_text())["rows"]}
    assert (rows["logs"]["positional_ids"], rows["clicks"]["beyond_end"]) == (3, 5)
    args = argparse.Namespace(checkpoint=str(root), fresh=False, only=None)
    assert run(topology, args) == 0
    again = capsys.readouterr().out
    assert positional in again and beyond in again, again


@pytest.mark.spark
def test_on_spark_the_log_injector_counts_its_records_without_an_id(
    tmp_path, spark, run_dir, second_counts
):
    """The Spark reader counts them as it reads (a summary row of the range, counted once the
    batch is published), so the status, the final report and ``finished.json`` have them."""
    import json

    from millwheel import LogFileSource
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        {"ts": T0 + i * 10, "key": f"k{i % 3}"} | ({"id": f"r{i}"} if i % 4 else {})
        for i in range(200)
    ]
    (logs / "part-0001.jsonl").write_text("".join(json.dumps(v) + "\n" for v in lines))
    rt = SparkRuntime(
        second_counts(LogFileSource(str(logs), finite=True, max_bytes_per_batch=5_000)),
        run_dir,
        RuntimeSettings(intervals=2),
        spark=spark,
    )
    rt.run(timeout_s=300)
    assert rt.status()["logs"]["positional_ids"] == 50
    row = next(r for r in Sampler(rt).sample().rows if r.name == "logs")
    assert row.positional_ids == 50
