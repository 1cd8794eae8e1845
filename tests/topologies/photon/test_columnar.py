"""The columnar joiner (``topologies/photon/columnar.py``, the default) against the per-record
``Joiner`` (``PhotonConfig(columnar_joiner=False)``) and the pandas batch join, on generated
logs with every difficulty of the generator (queries logged late, clicks before their
queries, duplicates, orphans, malformed lines, clicks without a query id).

The same productions — ids, timestamps, values, the IdRegistry's decisions — and the same
dead letters and counters, in big batches and in small ones, and in a paced replay with
wall-time retries and give-ups; Spark's run of the default joiner is compared with the
harness and the batch join in ``test_spark.py``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from millwheel.testing import Harness
from topologies.photon import PhotonConfig, batch_join, build, evaluate, replay
from topologies.photon.columnar import ColumnarJoiner
from topologies.photon.joiner import Joiner


def _run(data, cfg: PhotonConfig) -> Harness:
    h = Harness(build(data, config=cfg), raise_errors=False)
    h.run_sources()
    return h


def _records(h: Harness, stream: str) -> Counter:
    return Counter(
        (r.id, r.timestamp, json.dumps(r.value, sort_keys=True)) for r in h.output(stream)
    )


@pytest.mark.parametrize("max_bytes", [64 << 20, 6_000], ids=["one-batch", "small-batches"])
def test_the_columnar_joiner_makes_the_per_record_joiners_productions(sample, max_bytes):
    base = PhotonConfig(max_bytes_per_batch=max_bytes)
    per_record = _run(sample, dataclasses.replace(base, columnar_joiner=False))
    columnar = _run(sample, base)
    assert type(columnar._runners["Joiner"].computation) is ColumnarJoiner
    assert type(per_record._runners["Joiner"].computation) is Joiner
    for stream in ("joined_clicks", "unjoinable"):
        expected = _records(per_record, stream)
        assert sum(expected.values()) > (200 if stream == "joined_clicks" else 2), stream
        assert _records(columnar, stream) == expected, stream
    dead = Counter((d.id, d.value.stage, d.value.reason) for d in per_record.dead_letters())
    assert (
        dead
        and Counter((d.id, d.value.stage, d.value.reason) for d in columnar.dead_letters()) == dead
    )
    a, b = per_record.metrics("Joiner"), columnar.metrics("Joiner")
    for name in (
        "records_in",
        "duplicates",
        "late",
        "processed",
        "productions",
        "dead_letters",
        "once_committed",
        "once_conflicts",
    ):
        assert a[name] == b[name], name
    assert a["duplicates"] > 0
    # and the plain batch answer
    answer = batch_join(sample)
    assert sorted(
        json.dumps(j, sort_keys=True) for j in columnar.values("joined_clicks")
    ) == sorted(json.dumps(j, sort_keys=True) for j in answer.joined)
    assert {u["click"]["click_id"] for u in columnar.values("unjoinable")} == answer.orphans


def test_a_paced_replay_with_retries_and_give_ups_evaluates_the_same(sample):
    """Wall time moves (retries find late-logged queries in the logs, §3.2.1, §3.4.2), the
    low watermark gives clicks up: both joiners pass the evaluation with the same outputs."""
    per_record = replay(sample, mode="continuous", config=PhotonConfig(columnar_joiner=False))
    columnar = replay(sample, mode="continuous")
    for r in (per_record, columnar):
        assert evaluate(r, sample)["ok"]
    assert sorted(json.dumps(j, sort_keys=True) for j in columnar.joined) == sorted(
        json.dumps(j, sort_keys=True) for j in per_record.joined
    )
    assert sorted(json.dumps(u, sort_keys=True) for u in columnar.unjoinable) == sorted(
        json.dumps(u, sort_keys=True) for u in per_record.unjoinable
    )
    m = columnar.metrics["Joiner"]
    assert m["once_committed"] == per_record.metrics["Joiner"]["once_committed"] > 0


def test_a_click_before_its_query_in_one_batch_waits_and_joins_in_order(joiner, query, click):
    """The ids that leave the hash join (a click before its query in the same batch, clicks
    already waiting) run the rules record by record: ids and order as per record."""
    h = joiner()
    h.inject("clicks", [click("c1", "q1", 1_500), click("c2", "q2", 1_600)])
    h.inject("queries", [query("q2", 1_000), query("q1", 1_100), query("q3", 1_200)])
    h.inject("clicks", [click("c3", "q1", 1_700), click("c4", "q3", 1_800)])
    h.run()
    assert sorted(r.value["click_id"] for r in h.output("joined_clicks")) == [
        "c1",
        "c2",
        "c3",
        "c4",
    ]
    for q in ("q1", "q2", "q3"):  # nothing waits: only the cache's eviction is left, and no hold
        assert [t.tag for t in h.timers("Joiner", q)] == ["evict"], q
    assert h.metrics("Joiner")["once_committed"] == 4
