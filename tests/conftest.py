"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Spark workers must run this interpreter (the project's venv), never a system python.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python workers import the repository's packages (examples, topologies, computations)
# whatever directory they start in, as the suite's pytest workers do
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
# `millwheel run` serves the Spark UI by default; tests (and their subprocesses) do not
os.environ.setdefault("MILLWHEEL_SPARK_UI", "0")
# Every driver JVM of the suite (the session below, each driver a kill test starts) runs for
# seconds to minutes: the client compiler alone, and the serial collector, leave both cores
# to the work instead of the C2 compiler's and G1's threads. Measured side by side on a
# kill test that starts two drivers: 83 s against 53 s (docs/architecture.md, "Tests").
os.environ.setdefault("MILLWHEEL_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (a test using it is marked ``spark``: conftest.py at the root)."""
    from millwheel.runtime import spark_session

    session = spark_session("local[2]")
    yield session


def _bucket_count_class():
    from millwheel import Computation, ComputationOptions, LatePolicy

    class SecondCounts(Computation):
        options = ComputationOptions(late=LatePolicy.drop())

        def process_record(self, record):
            second = record.timestamp // 1_000 * 1_000
            counts = self.state.get({})
            counts[second] = counts.get(second, 0) + 1
            self.state.set(counts)
            self.set_timer(str(second), second + 999)

        def process_timer(self, timer):
            counts = self.state.get({})
            second = timer.timestamp - 999
            self.produce("counts", {"key": self.key, "second": second, "count": counts.pop(second)})
            self.state.set(counts or None)

    class Relay(Computation):
        """Each record on to ``relayed`` under its own timestamp, without timers."""

        def process_record(self, record):
            self.produce("relayed", record.value, timestamp=record.timestamp)

    return SecondCounts, Relay


@pytest.fixture
def id_relays():
    """``(per_record, columnar)``: a computation of each kind that sends each record's value
    on to ``out`` under its own timestamp and keeps nothing but its record ids, so a key
    seen once is an envelope of ids only (``DedupOptions``, dedup garbage collection)."""
    from millwheel import ColumnarComputation, Computation

    class Relay(Computation):
        def process_record(self, record):
            self.produce("out", record.value, timestamp=record.timestamp)

    class ColumnarRelay(ColumnarComputation):
        record_columns = ("key", "timestamp", "value")

        def process_batch(self, batch):
            r = batch.records
            batch.produce("out", list(r["value"]), keys=r["key"], timestamps=r["timestamp"])

    return Relay, ColumnarRelay


@pytest.fixture
def timed_id_relays(id_relays):
    """``(per_record, columnar)``: :func:`id_relays` that also set a low-watermark timer at
    each record's timestamp and do nothing when it fires: computations that handle timers,
    whose heartbeats the interval plans address to their key intervals (``docs/runtime.md``,
    "Heartbeats in the batch that reads them"); once it fired, a key keeps only its ids."""
    relay, columnar_relay = id_relays

    class TimedRelay(relay):
        def process_record(self, record):
            super().process_record(record)
            self.set_timer("t", record.timestamp)

        def process_timer(self, timer):
            pass

    class ColumnarTimedRelay(columnar_relay):
        def process_batch(self, batch):
            super().process_batch(batch)
            r = batch.records
            batch.set_timers(r["key"], ["t"] * len(r), r["timestamp"])

        def process_timers(self, batch, timers):
            pass

    return TimedRelay, ColumnarTimedRelay


@pytest.fixture
def second_counts():
    """``second_counts(source)``: a topology counting each key's records per second from
    ``source`` (``LatePolicy.drop()``), its output stream ``counts``; and ``.answer(output)``
    turns the output into ``{(key, second): count}`` to compare with a batch answer.
    ``second_counts(source, relay=True)``: the records reach the counter through a
    computation without timers (``Relay``), so the counter reads another computation's
    productions, whose sender watermark is not in their rows. ``columnar=True``: the
    counter is ``ColumnarWindowCounter`` (1 s windows); ``mapping``: its
    ``ComputationOptions.mapping``."""
    from collections import Counter

    from computations.columnar_windowing import ColumnarWindowCounter
    from millwheel import ComputationOptions, LatePolicy, Topology

    cls, relay_cls = _bucket_count_class()

    def topology(source, relay=False, columnar=False, mapping="default"):
        t = Topology("second-counts")
        t.injector("logs", source, stream="events")
        counted = "events"
        if relay:
            t.computation(
                relay_cls, inputs={"events": lambda r: r.value["key"]}, outputs=["relayed"]
            )
            counted = "relayed"
        t.computation(
            ColumnarWindowCounter if columnar else cls,
            name="SecondCounts",
            inputs={counted: lambda r: r.value["key"]},
            outputs=["counts"],
            options=ComputationOptions(late=LatePolicy.drop(), mapping=mapping),
            params={"output": "counts", "trailing_empty": 0} if columnar else None,
        )
        return t

    def answer(records):
        out = Counter()
        for r in records:
            second = r.value["second"] if "second" in r.value else r.value["window_start"]
            out[(r.value["key"], second)] += r.value["count"]
        return out

    topology.answer = answer
    return topology


def _edge_timer_classes():
    from millwheel import MAX_TIMESTAMP, Computation, ComputationOptions, LatePolicy, TimeDomain

    class Flusher(Computation):
        """A periodic flush on wall time and a total when the input is finished (Beam's end-of-window timer)."""

        def process_record(self, record):
            self.state.set((self.state.get(0) or 0) + 1)
            self.set_timer(
                "flush", self.now, TimeDomain.WALL_TIME
            )  # due at once, whatever the watermark
            self.set_timer("end", MAX_TIMESTAMP)

        def process_timer(self, timer):
            if timer.tag == "flush":
                self.produce(
                    "flushes", {"key": self.key, "count": self.state.get(0)}
                )  # no timestamp given
            else:
                self.produce("totals", {"key": self.key, "total": self.state.get(0)})

    class Totals(Computation):
        options = ComputationOptions(late=LatePolicy.drop())

        def process_record(self, record):
            self.state.set(record.value["total"])

    return Flusher, Totals


@pytest.fixture
def edge_timers():
    """``edge_timers(source)``: ``Flusher`` (a wall-time flush timer that produces without a
    timestamp, an event-time timer at ``MAX_TIMESTAMP``) feeding ``Totals`` (drops late records)."""
    from millwheel import Topology

    flusher, totals = _edge_timer_classes()

    def topology(source):
        t = Topology("edges")
        t.injector("words", source)
        t.computation(
            flusher, inputs={"words": lambda r: r.value["word"]}, outputs=["flushes", "totals"]
        )
        t.computation(totals, inputs={"totals": lambda r: r.value["key"]})
        return t

    return topology


@pytest.fixture
def late_log_topology(tmp_path):
    """A user's topology file over log files named with their open times, where a writer
    opened the second file 3 s after its first records were stamped: ``(path, logs)``.
    ``LATENESS_MS`` in the environment sets the source's ``lateness_ms``."""
    import json
    import textwrap

    logs = tmp_path / "my-logs"
    logs.mkdir()
    t0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z
    first = [{"id": f"a{i}", "ts": t0 + i * 100, "key": f"k{i % 3}"} for i in range(300)]
    second = [{"id": f"b{i}", "ts": t0 + 27_000 + i * 100, "key": f"k{i % 3}"} for i in range(300)]
    (logs / "events-2026-01-01T10-00-00.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in first)
    )
    (logs / "events-2026-01-01T10-00-30.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in second)
    )
    path = tmp_path / "late_counts.py"
    path.write_text(
        textwrap.dedent(
            f"""
        import os

        from millwheel import Computation, ComputationOptions, LatePolicy, LogFileSource, Topology

        class Count(Computation):
            options = ComputationOptions(late=LatePolicy.drop())

            def process_record(self, record):
                self.state.set((self.state.get(0) or 0) + 1)

        topology = Topology("late_counts")
        topology.injector("logs", LogFileSource({str(logs)!r}, finite=True, lateness_ms=int(os.environ.get("LATENESS_MS", "0"))))
        topology.computation(Count, inputs={{"logs": lambda r: r.value["key"]}})
        """
        )
    )
    return path, logs


@pytest.fixture(scope="session")
def drive_windows():
    """How the windowed tests feed a harness: ``drive(h, batches, wm) -> wm``. Each batch
    to its stream (``Record.stream``, default ``q``), then every injector's watermark moved
    to a third of the way into every other batch (one without records leaves it: a seed
    may draw one), and a run; returns the watermark, to go on from."""

    def drive(h, batches, wm):
        for i, batch in enumerate(batches):
            for stream in sorted({r.stream or "q" for r in batch}):
                h.inject(stream, [r for r in batch if (r.stream or "q") == stream])
            if i % 2 and batch:
                wm = max(wm, sorted(r.timestamp for r in batch)[len(batch) // 3])
                for injector in h.topology.injectors:
                    h.advance_watermark(injector, wm)
            h.run()
        return wm

    return drive


@pytest.fixture
def make_record():
    """Build records with unique ids: ``make_record(value, ts, key=None, id=None)``."""
    from millwheel import Record

    counter = iter(range(1, 10**9))

    def make(value, timestamp, key=None, id=None):
        return Record(key, value, timestamp, id if id is not None else f"r{next(counter)}")

    return make


@pytest.fixture
def real_logs():
    """Write JSON-lines logs shaped like real ones; return the plain batch answer.

    ``real_logs(directory, events=..., files=..., disorder_ms=...)`` writes ``events`` events
    in arrival order, cut into ``files`` consecutive files named ``part-0000.jsonl`` …
    (names without times), each event stamped up to ``disorder_ms`` before its arrival (so
    records run behind across file boundaries), about 1% duplicates re-sent a few lines
    later, and a few malformed lines. It returns ``{(key, second): count}`` of the distinct
    events — what a per-key one-second count must produce — and the paths written.
    ``only_lines=True`` returns the lines instead of writing them (a caller that appends
    them over time).
    """
    import json
    import random
    from collections import Counter

    def write(
        directory,
        *,
        events=20_000,
        files=8,
        disorder_ms=5_000,
        keys=40,
        rate_per_s=400,
        seed=7,
        start_ms=1_767_261_600_000,
        names="part-{:04d}.jsonl",
        only_lines=False,
    ):
        rng = random.Random(seed)
        lines, truth = [], Counter()
        recent = []
        for i in range(events):
            arrival = start_ms + i * 1_000 // rate_per_s
            ts = arrival - rng.randint(0, disorder_ms)
            key = f"k{rng.randrange(keys)}"
            line = json.dumps(
                {"id": f"e{i}", "ts": ts, "key": key, "path": f"/p/{rng.randrange(100)}"}
            )
            truth[(key, ts // 1_000 * 1_000)] += 1
            lines.append(line)
            recent.append(line)
            if rng.random() < 0.01:  # a client retry: the same event again, a little later
                lines.append(rng.choice(recent[-50:]))
            if rng.random() < 0.001:
                lines.append(f'{{"id": "broken-{i}", "ts": {ts}, "key": ')
        if only_lines:
            return truth, lines
        directory.mkdir(parents=True, exist_ok=True)
        per = -(-len(lines) // files)
        paths = []
        for f in range(files):
            path = directory / names.format(f)
            path.write_text("".join(x + "\n" for x in lines[f * per : (f + 1) * per]))
            paths.append(path)
        return truth, paths

    return write


@pytest.fixture
def tailed_logs():
    """``tailed_logs(source, steps)``: a :class:`~millwheel.Source` for the harness that reads
    the directory of the ``LogFileSource`` ``source`` as the Spark reader tails it live:
    after each of ``steps`` (functions that write to the directory), the shared reading plan
    (not finite: a growing file's half line waits) until it has caught up, its batches sent;
    after the last step (which completes the directory), to the end. ``.offsets`` holds
    the offset reached after each step."""
    import time

    from millwheel import MAX_TIMESTAMP, Source
    from millwheel._logfile import batches_between, initial_offset, plan_offset

    class Tailed(Source):
        def __init__(self, source, steps):
            self.opts, self.steps, self.offsets = source.read_options, list(steps), []

        def batches(self, injector="injector", stream="records"):
            offset = initial_offset()
            for step in self.steps:
                step()
                while True:
                    end = plan_offset(offset, self.opts, int(time.time() * 1000))
                    if end == offset:
                        break
                    yield from batches_between(self.opts, offset, end, injector, stream)
                    offset = end
                    if end["lw"] >= MAX_TIMESTAMP:
                        break
                self.offsets.append(offset)

    return Tailed


@pytest.fixture
def authority(tmp_path):
    """``millwheel authority serve`` in a subprocess (``faults/inject.py``: ``.kill9()``,
    ``.restart()``, ``.url``, ``.env()`` for a driver), stopped after the test."""
    from faults.inject import AuthorityProcess

    service = AuthorityProcess(tmp_path / "authority").start()
    yield service
    service.stop()


#: how long after a record its key's timer fires (``identity_topology``)
IDENTITY_TIMER_MS = 50


def _identity_classes():
    import pandas as pd

    from millwheel import ColumnarComputation, Computation

    class Echo(Computation):
        """One production per record (its delivery's tag, also its ``once_id``), and one when
        the key's timer fires (the tag of the delivery that set it last)."""

        def process_record(self, record):
            tag = record.value["tag"]
            self.produce("out", {"tag": tag}, once_id=tag)
            self.state.set(tag)
            self.set_timer("t", record.timestamp + IDENTITY_TIMER_MS)

        def process_timer(self, timer):
            tag = f"{self.state.get()}/fired"
            self.produce("out", {"tag": tag}, timestamp=timer.timestamp, once_id=tag)
            self.state.clear()

    class ColumnarEcho(ColumnarComputation):
        """``Echo`` as columns."""

        record_columns = ("key", "timestamp", "value")

        def process_batch(self, batch):
            r = batch.records
            tags = [v["tag"] for v in r["value"]]
            batch.produce(
                "out",
                [{"tag": t} for t in tags],
                keys=r["key"],
                timestamps=r["timestamp"],
                once_ids=tags,
            )
            last = r.groupby("key", sort=False, observed=True).tail(1)
            batch.set_state(
                pd.DataFrame({"key": last["key"], "tag": [v["tag"] for v in last["value"]]})
            )
            batch.set_timers(last["key"], ["t"] * len(last), last["timestamp"] + IDENTITY_TIMER_MS)

        def process_timers(self, batch, timers):
            s = batch.state
            when = dict(zip(timers["key"].tolist(), timers["timestamp"].tolist(), strict=True))
            fired = s[s["key"].isin(list(when))]
            tags = [f"{t}/fired" for t in fired["tag"]]
            at = [when[k] for k in fired["key"].tolist()]
            batch.produce(
                "out", [{"tag": t} for t in tags], keys=fired["key"], timestamps=at, once_ids=tags
            )
            batch.set_state(s.iloc[:0])

    class Sink(Computation):
        """The consumer: every production once (its dedup drops re-sends by id)."""

        def process_record(self, record):
            self.produce("seen", record.value["tag"])

    return Echo, ColumnarEcho, Sink


@pytest.fixture(scope="session")
def identity_topology():
    """``identity_topology(columnar=False, strong=True, source=None, mapping="default")``: the
    topology of the production-identity tests (``millwheel/_identity.py``). Injector ``in``
    (records ``{"key", "tag"}``, a tag per delivery) -> ``Echo`` (per-record or columnar;
    ``strong``: strong productions; late records processed; record ids kept 1 s behind the
    watermark) -> ``out`` (``{"tag"}``: the delivery's tag, or ``<tag>/fired`` for the
    key's timer, each with its tag as ``once_id``) -> ``Sink`` (remembers every id: a
    production dropped as a duplicate of an older one is missing from ``seen``)."""
    from millwheel import ComputationOptions, DedupOptions, LatePolicy, Topology

    echo, columnar_echo, sink = _identity_classes()

    def make(*, columnar=False, strong=True, source=None, mapping="default"):
        t = Topology("identity")
        t.injector("in", source)
        late = LatePolicy.process()  # a record shipped late is processed: a new delivery of it
        opts = ComputationOptions(
            strong_productions=strong,
            late=late,
            dedup=DedupOptions(slack_ms=1_000, gc_interval_ms=0),
            mapping=mapping,
        )
        t.computation(
            columnar_echo if columnar else echo,
            name="Echo",
            inputs={"in": lambda r: r.value["key"]},
            outputs=["out"],
            options=opts,
        )
        keep = ComputationOptions(late=late, dedup=DedupOptions(slack_ms=10**12))
        t.computation(
            sink, inputs={"out": lambda r: r.value["tag"]}, outputs=["seen"], options=keep
        )
        return t

    return make
