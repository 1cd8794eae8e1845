"""The seeded Photon sample (topologies/photon/generator.py): every difficulty of Photon §1.2, reproducibly."""

from __future__ import annotations

import json

from topologies.photon import GeneratorConfig, generate
from topologies.photon.generator import query_time


def test_the_same_seed_writes_the_same_logs(tmp_path):
    cfg = GeneratorConfig(seed=9, duration_s=5, rate=60)
    generate(tmp_path / "a", cfg)
    generate(tmp_path / "b", cfg)
    for log in ("queries", "clicks"):
        a = {p.name: p.read_bytes() for p in (tmp_path / "a" / log).iterdir()}
        b = {p.name: p.read_bytes() for p in (tmp_path / "b" / log).iterdir()}
        assert a == b and "_DONE" in a


def test_the_sample_has_every_difficulty(truth, sample):
    assert truth["delayed_queries"] > 0 and truth["clicks_before_query"] > 0
    assert truth["duplicate_clicks"] > 0 and truth["orphan_clicks"] > 0
    assert {m["kind"] for m in truth["malformed"]} == {
        "broken_json",
        "missing_ts",
        "non_integer_ts",
        "no_query_id",
    }
    for m in truth["malformed"]:  # each one is where the truth says
        data = (sample / m["log"] / m["file"]).read_bytes()
        line = data[m["offset"] : data.index(b"\n", m["offset"])]
        assert (m.get("marker") or m["id"]).encode() in line


def test_query_ids_encode_server_process_and_time(sample):
    """§3.1: the LogsEventStore finds a query's file from the time in its id."""
    for path in sorted((sample / "queries").glob("*.jsonl"))[:3]:
        for line in path.read_text().splitlines():
            try:
                q = json.loads(line)
            except ValueError:
                continue
            if "query_id" in q:
                assert query_time(q["query_id"]) == q["ts"]


def test_files_rotate_on_arrival_time_and_a_delayed_query_lands_in_a_later_file(truth, sample):
    times = [f["time_ms"] for f in truth["files"]["queries"]]
    assert times == sorted(times) and len(set(times)) == len(times)
    late = 0
    for f in truth["files"]["queries"]:
        for line in (sample / "queries" / f["name"]).read_text().splitlines():
            q = json.loads(line) if line.startswith('{"query_id"') else None
            late += q is not None and q["ts"] < f["time_ms"] - 1_000
    assert late >= truth["delayed_queries"] // 2
