"""The driver's log reader (``millwheel/runtime/_logreader.py``, ``RuntimeSettings.log_reader``).

The invariant: **every record of the directory is published exactly as often as it is in
the directory, whatever stops and restarts the reader, and a batch re-run after a stop
publishes the rows the in-memory source reads** (the ids are the lines' own, so a replay
reproduces them; the injector's productions are strong, MillWheel §6.1.2). The reader needs
no JVM, so the property is checked here over random stops at every step of its protocol,
files landing and growing between runs, and resumes; ``test_either_reader_resumes_the_others_run``
runs both readers over one run directory on Spark.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from millwheel import DEAD_LETTER_STREAM, MAX_TIMESTAMP, LogFileSource, MillwheelError
from millwheel._logfile import initial_offset, unread

pytest.importorskip("pyspark.sql.datasource")
from millwheel.runtime import _logreader  # noqa: E402
from millwheel.runtime._fs import Location  # noqa: E402
from millwheel.runtime._lease import FencedError  # noqa: E402
from millwheel.runtime._logreader import DriverLogReader  # noqa: E402
from millwheel.runtime._outbox import Outbox  # noqa: E402
from millwheel.runtime._spark_internals import (  # noqa: E402
    OFFSETS,
    committed_batches,
    offset_log_entries,
    planned_batches,
)
from millwheel.runtime._streams import FileStreamLog, read_log, table_records  # noqa: E402

STREAM = "events"
#: the reader's protocol steps a stop may come at (``crash_point`` names)
POINTS = ("before_output", "after_output", "before_commit")


class _Stop(Exception):
    """The reader's thread stopped at a chosen step (kill -9 of the driver, for the files)."""


class _Driver:
    """One driver's injector: an outbox and the reader over ``root``'s checkpoint."""

    def __init__(self, root: Location, source: LogFileSource) -> None:
        self.root = root
        root.child("tallies").mkdirs()  # as ``SparkRuntime.start`` makes it
        self.checkpoint = root.child("checkpoints", "injector.logs")
        self.outbox = Outbox(
            "logs",
            root.child("outbox", "injector.logs"),
            self.checkpoint,
            FileStreamLog(root),
            strong=True,
            on_summary=lambda _n, _s: None,
            tally=root.child("tallies", "injector.logs.json"),
        )
        self.outbox.recover()  # what ``LogFileInjector.start`` does before its reader starts
        options = {**source.options(), "injector": "logs", "stream": STREAM}
        self.reader = DriverLogReader("logs", self.checkpoint, self.outbox, options, poll_ms=20)
        self.opts = source.read_options

    def offset(self) -> dict:
        done = committed_batches(self.checkpoint)
        if not done:
            return initial_offset()
        return offset_log_entries(self.checkpoint.child(OFFSETS, str(done[-1])).read_text())[-1]

    def run(self, publish: bool = True, timeout: float = 60) -> None:
        """Until the reader stops or has read what the directory holds; publish as the driver loop does."""
        self.reader.start()
        deadline = time.monotonic() + timeout
        try:
            while self.reader.error is None:
                assert time.monotonic() < deadline, "the reader did not catch up"
                if publish:
                    self.outbox.publish_committed()
                if not unread(self.offset(), self.opts) and (
                    not publish or not self.outbox.loc.list()
                ):
                    break
                time.sleep(0.02)
        finally:
            self.reader.halt()
        if self.reader.error is not None and not isinstance(self.reader.error, _Stop):
            raise self.reader.error


def _published(root: Location) -> tuple[Counter, Counter]:
    log = FileStreamLog(root)
    records = Counter((r.id, r.timestamp, json.dumps(r.value)) for r in log.read(STREAM))
    dead = Counter(r.id for r in log.read(DEAD_LETTER_STREAM))
    return records, dead


def _in_memory(source: LogFileSource) -> tuple[Counter, Counter]:
    """What the harness's source reads from the directory as it is: the expected answer."""
    records, dead = Counter(), Counter()
    for batch in source.batches("logs", STREAM):
        records.update((r.id, r.timestamp, json.dumps(r.value)) for r in batch.records)
        dead.update(r.id for r in batch.dead_letters)
    return records, dead


def test_the_reader_publishes_the_in_memory_sources_records_and_the_batch_answer(
    tmp_path, real_logs
):
    truth, _ = real_logs(tmp_path / "logs", events=5_000, files=5, disorder_ms=3_000)
    (tmp_path / "logs" / "_DONE").write_text("")
    source = LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts")
    driver = _Driver(Location.of(str(tmp_path / "run")), source)
    driver.run()
    records, dead = _published(driver.root)
    assert (records, dead) == _in_memory(source)
    assert dead and all(n == 1 for n in dead.values())
    distinct = {(rid, ts, value) for rid, ts, value in records}
    counts = Counter((json.loads(v)["key"], ts // 1_000 * 1_000) for _, ts, v in distinct)
    assert counts == truth  # the plain batch answer, not only the other reader's
    assert driver.offset()["lw"] == MAX_TIMESTAMP


def test_a_large_batch_is_staged_as_one_file_per_stream(tmp_path, real_logs, monkeypatch):
    # read a part of ~PART_BYTES at a time, staged into one file: a consumer listing the
    # stream never sees half of the batch
    real_logs(tmp_path / "logs", events=3_000, files=6)
    (tmp_path / "logs" / "_DONE").write_text("")
    monkeypatch.setattr(_logreader, "PART_BYTES", 20_000)
    source = LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts")
    driver = _Driver(Location.of(str(tmp_path / "run")), source)
    driver.run()
    log = FileStreamLog(driver.root)
    assert len(log.files(STREAM, "logs")) == 1 and len(log.files(DEAD_LETTER_STREAM, "logs")) == 1
    assert _published(driver.root) == _in_memory(source)


def test_a_planned_batch_is_re_run_between_its_logged_offsets(tmp_path, real_logs, monkeypatch):
    # stopped once its offsets were logged: the next start reads the same bytes as batch 0,
    # though the directory has grown since (a new plan would take more), then the rest
    logs = tmp_path / "logs"
    real_logs(logs, events=2_000, files=2, seed=1)
    source = LogFileSource(logs, id_field="id", ts_field="ts")
    first = _in_memory(source)[0]
    root = Location.of(str(tmp_path / "run"))

    def stop(name, point, batch, has_data=True):  # noqa: ARG001
        if point == "before_output":
            raise _Stop

    with monkeypatch.context() as m:
        m.setattr(_logreader, "crash_point", stop)
        _Driver(root, source).run()
    assert not committed_batches(root.child("checkpoints", "injector.logs"))
    real_logs(
        logs, events=500, files=1, seed=2, start_ms=1_767_262_000_000, names="part-9{:03d}.jsonl"
    )
    _Driver(root, source).run()
    log = FileStreamLog(root)
    batch0 = Counter()
    for name in log.files(STREAM, "logs"):
        if name.startswith("b0000000000-"):
            rows = table_records(read_log(log.location(STREAM, "logs").child(name)))
            batch0.update((r.id, r.timestamp, json.dumps(r.value)) for r in rows)
    assert batch0 == first
    assert _published(root) == _in_memory(source)


def test_stops_at_every_step_and_restarts_lose_and_duplicate_nothing(
    tmp_path, real_logs, monkeypatch
):
    seed = int(os.environ.get("MILLWHEEL_LOGREADER_SEED") or random.SystemRandom().randrange(2**32))
    print(f"log reader stop campaign: seed {seed} (MILLWHEEL_LOGREADER_SEED={seed} repeats it)")
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    real_logs(logs, events=1_500, files=3, seed=rng.randrange(2**31), disorder_ms=2_000)
    root = Location.of(str(tmp_path / "run"))
    stops: Counter = Counter()
    for round_ in range(12):
        source = LogFileSource(
            logs,
            id_field="id",
            ts_field="ts",
            max_bytes_per_batch=rng.choice([4_000, 30_000, 1 << 20]),
        )
        what = rng.random()
        if what < 0.4:  # a file lands
            real_logs(
                logs,
                events=rng.randint(50, 400),
                files=1,
                seed=rng.randrange(2**31),
                start_ms=1_767_261_600_000 + 20_000 * (round_ + 1),
                names=f"part-{round_ + 10:04d}.jsonl",
                disorder_ms=2_000,
            )
        elif what < 0.6:  # the newest file grows by whole lines
            newest = sorted(logs.glob("part-*.jsonl"))[-1]
            _, lines = real_logs(
                logs, events=rng.randint(10, 100), seed=rng.randrange(2**31), only_lines=True
            )
            with newest.open("a") as fh:
                fh.write("".join(f"{line}\n" for line in lines))
        point, at = rng.choice(POINTS), rng.randrange(3)

        def stop(name, where, batch, has_data=True, point=point, at=at):  # noqa: ARG001
            if where == point and batch % 3 == at:
                stops[where] += 1
                raise _Stop

        with monkeypatch.context() as m:
            # the logs purged as they grow, from the middle on: what a driver before left
            # unpurged (Spark's reader, below its 100) goes too
            m.setattr(_logreader, "RETAIN", 1_000 if round_ < 6 else 5)
            if rng.random() < 0.8:
                m.setattr(_logreader, "crash_point", stop)
            # a driver may also die between a commit and its publication
            _Driver(root, source).run(publish=rng.random() < 0.7)
    (logs / "_DONE").write_text("")
    final = LogFileSource(logs, id_field="id", ts_field="ts")
    monkeypatch.setattr(_logreader, "RETAIN", 5)
    _Driver(root, final).run()
    got, got_dead = _published(root)
    want, want_dead = _in_memory(final)
    lost, duplicated = want - got, got - want
    print(f"seed {seed}: {sum(want.values())} records, stops {dict(stops)}")
    assert not lost and not duplicated, (
        f"seed {seed}: lost {len(lost)}, duplicated {len(duplicated)}"
    )
    assert got_dead == want_dead, f"seed {seed}"
    # what is left of each log is one run of batches ending at the last, as Spark leaves it
    checkpoint = root.child("checkpoints", "injector.logs")
    committed = committed_batches(checkpoint)
    assert committed == list(range(max(0, committed[-1] - 5), committed[-1] + 1)), f"seed {seed}"
    assert planned_batches(checkpoint) == committed, f"seed {seed}"


@pytest.mark.spark
def test_either_reader_resumes_the_others_run(tmp_path, spark, real_logs, second_counts):
    """One run directory, read by the driver's reader, then Spark's query, then the driver's
    again, with files landing between: the count is the batch answer (both readers keep
    the checkpoint's offsets in Spark's format)."""
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs = tmp_path / "logs"
    truth = Counter()
    run = str(tmp_path / "run")
    for i, reader in enumerate(["driver", "spark", "driver"]):
        part, lines = real_logs(
            logs,
            events=1_500,
            seed=10 + i,
            start_ms=1_767_261_600_000 + 60_000 * i,
            only_lines=True,
        )
        truth.update(part)
        logs.mkdir(exist_ok=True)
        for f in range(2):  # ids of their own in each round: equal ids are one record to a consumer
            half = lines[f * len(lines) // 2 : (f + 1) * len(lines) // 2]
            text = "".join(f"{line}\n" for line in half).replace('"id": "e', f'"id": "r{i}e')
            (logs / f"run{i}-{f:02d}.jsonl").write_text(text)
        if i == 2:
            (logs / "_DONE").write_text("")
        t = second_counts(LogFileSource(logs, id_field="id", ts_field="ts"))
        rt = SparkRuntime(
            t, run, RuntimeSettings(intervals=2, poll_ms=50, log_reader=reader), spark=spark
        )
        rt.start()
        try:
            injector = rt.injectors["logs"]
            assert (injector.reader is not None) == (reader == "driver")
            deadline = time.monotonic() + 300
            while unread(injector.offset or initial_offset(), injector.source.read_options):
                assert time.monotonic() < deadline, rt.status()
                rt.poll()
                time.sleep(0.05)
        finally:
            rt.stop()
    rt = SparkRuntime(
        second_counts(LogFileSource(logs, id_field="id", ts_field="ts")),
        run,
        RuntimeSettings(intervals=2, drain=True),
        spark=spark,
    )
    rt.run(timeout_s=600)
    assert second_counts.answer(rt.output("counts")) == truth


def test_the_driver_reads_before_spark_is_up(tmp_path, real_logs):
    # ``millwheel run`` starts the driver's readers, then Spark: reading needs no JVM, and
    # the computations' first batches find the records
    from millwheel import Computation, Topology
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    class Count(Computation):
        def process_record(self, record):
            self.state.set((self.state.get(0) or 0) + 1)

    real_logs(tmp_path / "logs", events=2_000, files=2)
    source = LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts", finite=True)
    t = Topology("early")
    t.injector("logs", source, stream=STREAM)
    t.computation(Count, inputs={STREAM: lambda r: r.value["key"]})
    rt = SparkRuntime(t, str(tmp_path / "run"), RuntimeSettings(master="local[2]"))
    rt.start_readers()
    injector = rt.injectors["logs"]
    try:
        deadline = time.monotonic() + 60
        while injector.low_watermark < MAX_TIMESTAMP:  # published by the reader itself
            assert injector.reader.error is None and time.monotonic() < deadline
            time.sleep(0.02)
        assert rt._spark is None  # noqa: SLF001 - no session was made for it
        assert _published(rt.root) == _in_memory(source)
        other = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://h:7077"))
        with pytest.raises(MillwheelError, match="built for master 'local\\[2\\]'"):
            rt.use_session(other)  # the readers were chosen for this master
    finally:
        injector.stop()
    cluster = SparkRuntime(t, str(tmp_path / "other"), RuntimeSettings(master="spark://h:7077"))
    assert cluster.injectors["logs"].reader_kind() == "spark"
    cluster.start_readers()  # nothing the driver reads: nothing started
    assert not cluster.injectors["logs"].reading and cluster._spark is None  # noqa: SLF001


def test_a_batch_another_driver_planned_meanwhile_is_never_replaced(tmp_path, real_logs):
    # a driver paused between its fence check and its plan's write, whose batch a newer
    # driver planned meanwhile: it stops, and the newer driver's offsets stay
    real_logs(tmp_path / "logs", events=500, files=1)
    source = LogFileSource(tmp_path / "logs", id_field="id", ts_field="ts")
    driver = _Driver(Location.of(str(tmp_path / "run")), source)
    entry = driver.checkpoint.child(OFFSETS, "0")
    plan = driver.reader.reader.latestOffset

    def planned_meanwhile(start):
        entry.write_text('v1\n{"batchWatermarkMs":0}\n{"newer": "driver"}')
        return plan(start)

    driver.reader.reader.latestOffset = planned_meanwhile
    driver.reader.start()
    driver.reader.join(timeout=60)
    assert isinstance(driver.reader.error, FencedError), driver.reader.error_text
    assert offset_log_entries(entry.read_text()) == [{"newer": "driver"}]
    assert not committed_batches(driver.checkpoint)
