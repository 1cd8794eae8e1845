"""The journal: a restarted authority carries on exactly where it stopped (§7.2)."""

from __future__ import annotations

import pytest

from millwheel import MIN_TIMESTAMP
from watermark_authority import Authority, MemoryJournal, RocksJournal, StaleTokenError
from watermark_authority._journal import decode, encode


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
    "op",
    [
        ("next_token", 12),
        ("computation", "c/with:odd chars"),
        ("interval", "c", "a-m", 3, -(2**63), None, None),
        ("interval", "c", "n-z", 4, 2**63 - 1, 17, 1_700_000_000_000),
        ("injector", "logs", ["p0", "p1"]),
        ("injector", "logs", None),
        ("process", "logs", "p0", 12, 34),
        ("published", "c", 99),
        ("pct", "c", "99.000", 100),
        ("retired", "c", "a", 2),
    ],
)
def test_ops_round_trip_through_the_encoding(op):
    key, value = encode(op)
    assert value is not None
    assert decode(key, value) == op
