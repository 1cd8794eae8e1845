"""The LogsEventStore (topologies/photon/eventstore.py, Photon §3.4.2): queries found in the query logs by id."""

from __future__ import annotations

import json

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
