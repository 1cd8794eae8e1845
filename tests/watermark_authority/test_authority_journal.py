"""The journal: a restarted authority carries on exactly where it stopped (§7.2)."""

from __future__ import annotations

import msgpack
import pytest

from watermark_authority import (
    MIN_TIMESTAMP,
    Authority,
    MemoryJournal,
    RocksJournal,
    StaleTokenError,
)
from watermark_authority._journal import (
    JOURNAL_FORMAT,
    RECORDS,
    ComputationAdded,
    FormatVersion,
    InjectorAdded,
    IntervalDropped,
    IntervalRetired,
    IntervalState,
    IntervalUnretired,
    PercentilePublished,
    ProcessDropped,
    ProcessReported,
    TokenCounter,
    WatermarkPublished,
    decode,
    encode,
)


@pytest.fixture(params=["memory", "rocksdb"])
def reopen(request, tmp_path):
    """``reopen()`` returns a new Authority on the same journal (the old one is dropped)."""
    memory = MemoryJournal()
    current: list[Authority] = []

    def make() -> Authority:
        if current:
            current[-1].close()
        journal = memory if request.param == "memory" else RocksJournal(tmp_path / "journal")
        current.append(Authority(journal, clock=lambda: 42))
        return current[-1]

    yield make
    if current:
        current[-1].close()


def test_everything_survives_a_restart(reopen):
    a = reopen()
    t = a.acquire("c", ["a", "b", "c"])
    a.report("c", [("a", t["a"], 1_000, 3), ("b", t["b"], 2_000, None), ("c", t["c"], 3_000, 1)])
    assert a.watermark("c") == 1_000
    kids = a.split("c", "c", ["c1", "c2"])
    a.expect_injector_processes("logs", ["p0", "p1"])
    a.report_injector("logs", "p0", 7_000)
    p50 = a.percentile_watermark("c", 50)
    before = (a.intervals("c"), a.watermarks(), p50)

    b = reopen()
    assert (b.intervals("c"), b.watermarks(), b.percentile_watermark("c", 50)) == before
    assert b.watermark("logs") == MIN_TIMESTAMP  # p1 still missing
    with pytest.raises(StaleTokenError):
        b.report("c", [("c", t["c"], 9_000, None)])  # split away before the restart
    b.report("c", [("c1", kids["c1"], 9_000, None)])  # the new owners' tokens still work
    new = b.acquire("c", ["a"])["a"]
    assert new > max(kids.values())  # the token counter survived too
    with pytest.raises(StaleTokenError):
        b.report("c", [("a", t["a"], 9_000, None)])


def test_a_published_value_is_never_lower_after_a_restart(reopen):
    a = reopen()
    t = a.acquire("c", ["a"])["a"]
    a.report("c", [("a", t, 5_000, None)])
    assert a.watermark("c") == 5_000
    a.report("c", [("a", t, 1_000, None)])  # late: the raw value drops
    b = reopen()
    assert b.watermark("c") == 5_000


def test_nothing_is_applied_when_the_journal_fails():
    class Broken(MemoryJournal):
        fail = False

        def commit(self, ops):
            if self.fail:
                msg = "disk full"
                raise OSError(msg)
            super().commit(ops)

    j = Broken()
    a = Authority(j)
    t = a.acquire("c", ["a"])["a"]
    a.report("c", [("a", t, 5, None)])
    j.fail = True
    with pytest.raises(OSError):
        a.report("c", [("a", t, 10, None)])
    with pytest.raises(OSError):
        a.acquire("c", ["a"])
    assert a.intervals("c")["a"]["value"] == 5 and a.current_token("c", "a") == t


@pytest.mark.parametrize(
    "record",
    [
        TokenCounter(12),
        ComputationAdded("c/with:odd chars"),
        IntervalState("c", "a-m", 3, -(2**63), None, None),
        IntervalState("c", "n-z", 4, 2**63 - 1, 17, 1_700_000_000_000, "host:42"),
        InjectorAdded("logs", ("p0", "p1")),
        InjectorAdded("logs", None),
        ProcessReported("logs", "p0", 12, 34),
        WatermarkPublished("c", 99),
        PercentilePublished("c", "99.000", 100),
        IntervalRetired("c", "a", 2),
        FormatVersion(JOURNAL_FORMAT),
    ],
)
def test_records_round_trip_through_the_encoding(record):
    key, value = encode(record)
    assert value is not None
    back = decode(key, value)
    assert back == record and type(back) is type(record)


def test_every_record_kind_has_its_own_class_and_deletes_share_the_key_of_what_they_delete():
    assert set(RECORDS) == {
        "next_token",
        "computation",
        "interval",
        "drop_interval",
        "retired",
        "unretire",
        "injector",
        "process",
        "drop_process",
        "published",
        "pct",
        "format",
    }
    for delete, of in [
        (IntervalDropped("c", "a"), IntervalState("c", "a", 1, 0, None, None)),
        (IntervalUnretired("c", "a"), IntervalRetired("c", "a", 1)),
        (ProcessDropped("l", "p"), ProcessReported("l", "p", 1, 2)),
    ]:
        assert encode(delete) == (encode(of)[0], None)


def test_a_format_1_journal_is_read_and_upgraded():
    """Format 1 wrote positional tuples without an owner and no format key; it still loads."""
    j = MemoryJournal()
    sep = "\x00"
    j.data = {
        b"c\x00c": msgpack.packb(()),
        sep.join(("i", "c", "a")).encode(): msgpack.packb(
            (3, 1_000, 5, 77)
        ),  # token, value, pending, updated (no owner)
        sep.join(("i", "c", "b")).encode(): msgpack.packb((4, 2_000, None, 78)),
        b"p\x00c": msgpack.packb((900,)),
        b"t": msgpack.packb((5,)),
    }
    a = Authority(j, clock=lambda: 0)
    assert a.intervals("c") == {
        "a": {"token": 3, "owner": None, "value": 1_000, "pending": 5, "updated_ms": 77},
        "b": {"token": 4, "owner": None, "value": 2_000, "pending": None, "updated_ms": 78},
    }
    assert a.watermark("c") == 1_000  # published on load: the raw value had risen above 900
    assert a.acquire("c", ["z"])["z"] == 5
    assert decode(b"_", j.data[b"_"]) == FormatVersion(
        JOURNAL_FORMAT
    )  # now marked as the current format


def test_a_journal_of_a_newer_format_is_refused_with_a_reason():
    j = MemoryJournal()
    j.commit([FormatVersion(JOURNAL_FORMAT + 1)])
    with pytest.raises(
        ValueError, match=f"format {JOURNAL_FORMAT + 1}, newer than this millwheel reads"
    ):
        Authority(j)
    j = MemoryJournal()
    j.data[b"e\x00x"] = msgpack.packb((1,))
    with pytest.raises(ValueError, match="prefix 'e', unknown to this version"):
        Authority(j)
