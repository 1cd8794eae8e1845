"""The LogsEventStore (topologies/photon/eventstore.py, Photon §3.4.2): queries found in the query logs by id."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.photon.eventstore import LogsEventStore


def _q(i: int, ts: int) -> dict:
    return {"query_id": f"10.0.0.1:4000:{ts}:{i}", "ts": ts, "ad_text": f"ad {i}"}


def test_finds_every_query_of_a_sample_and_nothing_else(sample):
    store = LogsEventStore(sample / "queries")
    found = 0
    for path in sorted((sample / "queries").glob("*.jsonl"))[::5]:
        for line in path.read_text().splitlines():
            if line.startswith('{"query_id"'):
                q = json.loads(line)
                assert store.lookup(q["query_id"]) == q
                found += 1
    assert found > 100
    assert store.lookup("10.0.0.1:4000:1700000005000:999999") is None


def test_a_growing_file_is_indexed_further_and_a_partial_line_is_not_read(tmp_path):
    log = tmp_path / "queries_1700000000000.jsonl"
    a, b = _q(1, 1_700_000_000_100), _q(2, 1_700_000_000_200)
    log.write_text(json.dumps(a) + "\n" + json.dumps(b)[:20])
    store = LogsEventStore(tmp_path)
    assert store.lookup(a["query_id"]) == a and store.lookup(b["query_id"]) is None
    log.write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    assert store.lookup(b["query_id"]) == b
    assert store.lines_indexed == 2  # the first line was not read again


def test_only_files_near_the_time_in_the_id_are_read(tmp_path):
    near, far = _q(1, 1_700_000_000_500), _q(2, 1_700_000_900_500)
    (tmp_path / "queries_1700000000000.jsonl").write_text(json.dumps(near) + "\n")
    (tmp_path / "queries_1700000900000.jsonl").write_text(json.dumps(far) + "\n")
    (tmp_path / "_DONE").write_text("")
    store = LogsEventStore(tmp_path, window_ms=60_000, lateness_ms=30_000)
    assert store.lookup(near["query_id"]) == near
    assert store.lines_indexed == 1
    assert store.lookup(far["query_id"]) == far and store.lines_indexed == 2


def test_a_missing_directory_finds_nothing(tmp_path):
    assert LogsEventStore(tmp_path / "nope").lookup(_q(1, 1_700_000_000_000)["query_id"]) is None


def _log(d, q) -> None:
    (d / f"queries_{q['ts'] // 1000 * 1000}.jsonl").write_text(json.dumps(q) + "\n")


def test_the_listing_is_reused_until_the_directory_changes(tmp_path, monkeypatch):
    a, b = _q(1, 1_700_000_000_100), _q(2, 1_700_000_001_100)
    _log(tmp_path, a)
    old = 1_600_000_000_000_000_000  # a directory unchanged for long: its listing is kept
    os.utime(tmp_path, ns=(old, old))
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: listed.append(p) or real(p))
    store = LogsEventStore(tmp_path)
    assert store.lookup(a["query_id"]) == a and store.lookup(a["query_id"]) == a
    assert len(listed) == 1
    _log(tmp_path, b)  # a new file changes the directory's time: listed again, found
    assert store.lookup(b["query_id"]) == b and len(listed) == 2


def test_a_listing_taken_as_the_directory_changed_is_not_trusted(tmp_path):
    """A file added in the same file-system tick as the listing leaves the directory's time
    as it was: the listing right after a change is taken again next time."""
    a, b = _q(1, 1_700_000_000_100), _q(2, 1_700_000_001_100)
    _log(tmp_path, a)
    store = LogsEventStore(tmp_path)
    assert store.lookup(a["query_id"]) == a  # the directory changed just now: a racy listing
    mtime = os.stat(tmp_path).st_mtime_ns
    _log(tmp_path, b)
    os.utime(tmp_path, ns=(mtime, mtime))  # as if in the same tick
    assert store.lookup(b["query_id"]) == b


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(
        st.one_of(st.none(), st.integers(0, 40).map(lambda k: 1_700_000_000_000 + 7_500 * k)),
        max_size=12,
    ),
    t=st.integers(1_699_999_900_000, 1_700_000_400_000),
)
def test_the_candidate_files_are_those_near_the_time_nearest_first(tmp_path_factory, times, t):
    """``_candidates`` (bisection in the listing ordered by time) gives what a scan of every
    file's time gives: the files within the window before ``t`` and the lateness after it,
    and the files without a time, ordered by distance, then name."""
    d = tmp_path_factory.mktemp("logs")
    for i, ft in enumerate(times):
        (d / (f"queries_{ft}_{i}.jsonl" if ft is not None else f"queries_x{i}.jsonl")).write_text(
            ""
        )
    store = LogsEventStore(d, window_ms=60_000, lateness_ms=30_000)
    scan = sorted(
        (0 if ft is None else abs(ft - t), name)
        for name, ft in store._files()
        if ft is None or t - 60_000 <= ft <= t + 30_000
    )
    assert store._candidates(t) == [name for _, name in scan]
