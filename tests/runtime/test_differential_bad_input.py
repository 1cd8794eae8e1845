"""Differential test of the delivery path on bad input: harness vs local Spark vs a plain
computation of the expected answer (docs/architecture.md, "One semantics, two backends").

The logs are what users really have: files named ``clicks-2026-01-01T10-00.jsonl`` and
``0003.jsonl`` (no time in the name), a duplicate in a later file, a late record,
malformed lines (broken JSON, an int id, a string timestamp, a 2**70 timestamp), records
whose key extractor fails or returns a float, a record on which user code raises, and a
tuple key, a value that cannot be stored, a timer beyond 64 bits, a driver-side source
sending bad ids and timestamps, and a dead-letter reader that fails on every dead letter.
The Spark run reads them with the runtime's streaming reader and a byte budget
of a few lines per batch, free-running (no lockstep). Both backends must give the same
productions, the same dead letters (same ids, stages, reasons, files and offsets) and the
same counters.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from millwheel import (
    MAX_TIMESTAMP,
    Computation,
    LogFileSource,
    Record,
    SampleSource,
    Stage,
    Timer,
    Topology,
)
from millwheel._counters import StepMetrics
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.testing import Harness

pytestmark = pytest.mark.spark

T0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z


class CountPerUser(Computation):
    """Counts each (user, region)'s records; the totals come out once the input is finished."""

    def process_record(self, record: Record) -> None:
        if record.value.get("boom"):
            msg = f"boom on {record.id}"
            raise RuntimeError(msg)
        if record.value.get("lock"):  # a value that cannot be stored: fails this record only
            self.state.set(threading.Lock())
            return
        if record.value.get("far"):
            self.set_timer("far", 2**70)
        self.state.set(self.state.get(0) + 1)
        self.produce("seen", {"id": record.id, "stream": record.stream, "key": list(self.key)})
        self.set_timer("end", MAX_TIMESTAMP - 1)

    def process_timer(self, timer: Timer) -> None:
        self.produce(
            "totals", {"key": list(self.key), "count": self.state.get()}, timestamp=timer.timestamp
        )


def _line(**fields) -> str:
    return json.dumps(fields) + "\n"


def write_logs(d) -> dict:
    d.mkdir()
    good = 0
    with open(d / "clicks-2026-01-01T10-00.jsonl", "w") as f:
        for i in range(12):
            f.write(_line(id=f"a{i}", ts=T0 + i * 1_000, user=f"u{i % 3}", region="eu"))
            good += 1
        f.write("{broken json\n")
        f.write(_line(id=7, ts=T0 + 5, user="u1"))  # an int id
        f.write(_line(id="nouser", ts=T0 + 6))  # the key extractor fails
        f.write(_line(id="floatuser", ts=T0 + 7, user=2.5))  # not a key
    with open(d / "clicks-2026-01-01T10-01.jsonl", "w") as f:
        for i in range(12):
            f.write(_line(id=f"b{i}", ts=T0 + 60_000 + i * 1_000, user=f"u{i % 4}"))
            good += 1
        f.write(
            _line(id="a3", ts=T0 + 3_000, user="u0", region="eu")
        )  # duplicate (late too, but dup first)
        f.write(_line(id="late1", ts=T0 + 30_000, user="u2"))  # behind the file's time: late
        f.write(_line(id="strts", ts="soon", user="u1"))
        f.write(_line(id="huge", ts=2**70, user="u1"))
        f.write(_line(id="boom1", ts=T0 + 61_500, user="u9", boom=True))
        f.write(
            _line(id="lock1", ts=T0 + 61_600, user="u0", lock=True)
        )  # u0's other records still count
        f.write(_line(id="far1", ts=T0 + 61_700, user="u1", far=True))
    # no time in the name; it sorts first, so it is read (and finished) first: until then it
    # would hold the watermark (nothing known of it), and no record could be late
    with open(d / "0003.jsonl", "w") as f:
        for i in range(6):
            f.write(_line(id=f"c{i}", ts=T0 + 120_000 + i * 1_000, user="u1", region="us"))
            good += 1
    return {"good": good}


class FailsOnDeadLetters(Computation):
    """Reads dead_letters and fails on every one: its failures must not loop."""

    def process_record(self, record: Record) -> None:
        msg = f"cannot handle {record.value.stage}"
        raise ValueError(msg)


def topology(d) -> Topology:
    t = Topology("badinput")
    t.injector("clicks", LogFileSource(d, finite=True, max_bytes_per_batch=300))
    # a driver-side source with records a buggy injector could send
    bad = [
        Record(None, {"user": "s1"}, T0 + 1, "ok1"),
        Record(None, {"user": "s1"}, "soon", "badts"),
        Record(None, {"user": "s1"}, T0 + 2, 42),
        Record(None, {"user": "s1"}, 2**64, "hugets"),
    ]
    t.injector("more", SampleSource(bad), stream="clicks_more")
    by_user = lambda r: (r.value["user"], r.value.get("region", "-"))  # noqa: E731
    t.computation(
        CountPerUser, inputs={"clicks": by_user, "clicks_more": by_user}, outputs=["seen", "totals"]
    )
    t.computation(FailsOnDeadLetters, inputs={"dead_letters": lambda r: r.value.stage})
    return t


def _dead(records):
    out = Counter()
    for r in records:
        v = r.value
        out[
            (
                r.id,
                r.timestamp,
                v.stage,
                v.reason,
                v.file,
                v.offset,
                v.record.id if v.record else None,
            )
        ] += 1
    return out


@pytest.fixture(scope="module", params=["intervals", "keys"])
def runs(request, tmp_path_factory, spark):
    """Both state layouts (``RuntimeSettings.state_layout``) against the same harness run."""
    base = tmp_path_factory.mktemp(f"badinput-{request.param}")
    facts = write_logs(base / "logs")
    h = Harness(topology(base / "logs"), raise_errors=False)
    h.run_sources()
    rt = SparkRuntime(
        topology(base / "logs"),
        str(base / "run"),
        RuntimeSettings(drain=True, intervals=4, state_layout=request.param),
        spark=spark,
    )
    rt.run(timeout_s=600)
    return h, rt, facts


def test_same_productions_as_each_other_and_as_the_plain_answer(runs, productions):
    h, rt, facts = runs
    for stream in ("seen", "totals"):
        assert productions(rt.output(stream), ids=False) == productions(
            h.output(stream), ids=False
        ), stream
    totals = {tuple(v["key"]): v["count"] for v in h.values("totals")}
    # the plain answer: every good record once, the late one dropped, the duplicate removed
    expected = Counter()
    for i in range(12):
        expected[(f"u{i % 3}", "eu")] += 1
        expected[(f"u{i % 4}", "-")] += 1
    for _ in range(6):
        expected[("u1", "us")] += 1
    expected[("s1", "-")] += 1
    assert totals == dict(expected)
    assert sum(totals.values()) == facts["good"] + 1
    assert {v["stream"] for v in h.values("seen")} == {"clicks", "clicks_more"}


def test_same_dead_letters_with_reasons(runs):
    h, rt, _ = runs
    assert _dead(rt.dead_letters()) == _dead(h.dead_letters())
    by_stage = Counter(r.value.stage for r in h.dead_letters())
    assert by_stage == {
        Stage.MALFORMED: 4,
        Stage.KEY_EXTRACTOR: 2,
        Stage.PROCESS_RECORD: 2,
        Stage.CHECKPOINT: 1,
        Stage.INVALID_RECORD: 3,
    }
    reasons = " | ".join(r.value.reason for r in h.dead_letters())
    for part in (
        "broken JSON",
        "must be a non-empty string, got int",
        "not an integer",
        "64-bit",
        "KeyError",
        "got float 2.5",
        "boom on boom1",
        "cannot pickle",
        "set_timer('far')",
        "timestamp must be an int",
        "id must be a non-empty str",
    ):
        assert part in reasons, part
    assert len({r.id for r in h.dead_letters()}) == len(h.dead_letters())  # unique ids
    # the reader that fails on every dead letter made none of its own: no loop
    assert h.metrics("FailsOnDeadLetters")["dead_letters_dropped"] == len(h.dead_letters())
    assert rt.computations["FailsOnDeadLetters"].metrics["dead_letters_dropped"] == len(
        rt.dead_letters()
    )
    malformed = [r for r in h.dead_letters() if r.value.stage == Stage.MALFORMED]
    assert all(
        r.timestamp in (T0, T0 + 60_000) for r in malformed
    )  # the file's time, on both backends


def test_same_counters(runs):
    h, rt, _ = runs
    for name in ("CountPerUser", "FailsOnDeadLetters"):
        hm, sm = h.metrics(name), StepMetrics.of(rt.computations[name].metrics).as_dict()
        # every counter, the same on both backends, except the ones shaped by how input is
        # cut into steps (the harness's rounds, Spark's batches of a few lines)
        shaped = {
            "dedup_gc_runs",
            "dedup_ids_collected",
            "bloom_maybe",
            "bloom_false_positive",
            "productions_behind_watermark",
        }
        assert {k: v for k, v in sm.items() if k not in shaped} == {
            k: v for k, v in hm.items() if k not in shaped
        }, name
    hm = h.metrics("CountPerUser")
    assert hm["late"] == 1 and hm["duplicates"] == 1 and hm["dead_letters"] == 5
