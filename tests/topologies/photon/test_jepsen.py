"""The Jepsen-style Photon check (``topologies/photon/jepsen.py``): its checker, one CI round on
Spark, and the long form (20 rounds, ``-m slow``; ``millwheel photon check --rounds 20``)."""

from __future__ import annotations

import json
import shutil

import pytest

from topologies.photon import PhotonConfig
from topologies.photon.jepsen import CheckSettings, PhotonCheck, check_outputs


def _write_stream(run, stream, values):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from millwheel._codec import encode_value
    from millwheel.runtime import FileStreamLog
    from millwheel.runtime._fs import Location

    log = FileStreamLog(Location.of(str(run)))
    log.ensure(stream, "Joiner")
    staged = run / f"staged-{stream}.parquet"
    pq.write_table(pa.table({"id": [f"{stream}{i}" for i in range(len(values))], "ts": list(range(len(values))),
                             "key": [None] * len(values), "value": [encode_value(v) for v in values],
                             "wm": [None] * len(values)}), staged)  # fmt: skip
    log.publish(Location.of(str(staged)), stream, "Joiner", "b0000000000-x", 0)


def test_the_checker_counts_lost_twice_unseen_and_both(tmp_path, sample):
    # outputs made by hand from the batch answer: one joinable click lost, one written twice,
    # one orphan not reported, one click joined and decided unjoinable
    from topologies.photon.evaluation import batch_join

    answer = batch_join(sample)
    joined = sorted(answer.joined, key=lambda j: j["click_id"])
    orphans = sorted(answer.orphans)
    a, b = tmp_path / "dc1", tmp_path / "dc2"
    _write_stream(a, "joined_clicks", joined[1:])  # joined[0] lost
    _write_stream(b, "joined_clicks", [joined[1]])  # twice
    unjoinable = [{"click": {"click_id": o}, "reason_code": "no_query", "reason": ""} for o in orphans[1:]]  # orphans[0] unseen
    unjoinable.append({"click": {"click_id": joined[2]["click_id"]}, "reason_code": "adapter_skipped", "reason": ""})  # both
    unjoinable.append({"click": {"click_id": joined[3]["click_id"]}, "reason_code": "no_query", "reason": ""})  # superseded
    _write_stream(b, "unjoinable", unjoinable)
    _write_stream(a, "unjoinable", unjoinable[-3:-2])  # an orphan given up twice: twice in unjoinable
    counts = check_outputs(sample, [a, b], PhotonConfig())
    assert (counts.lost, counts.twice, counts.unseen, counts.both, counts.unexpected, counts.superseded_give_ups) == (1, 2, 1, 1, 0, 1)
    assert counts.twice_by_stream == {"joined_clicks": 1, "unjoinable": 1}
    assert not counts.ok and "lost 1, twice 2 (joined_clicks 1, unjoinable 1), unseen 1" in counts.line()
    shutil.rmtree(b)
    _write_stream(b, "unjoinable", [{"click": {"click_id": o}, "reason_code": "no_query", "reason": ""} for o in orphans])
    shutil.rmtree(a)
    _write_stream(a, "joined_clicks", joined)
    assert check_outputs(sample, [a, b], PhotonConfig()).ok


def _rounds(tmp_path, rounds, seed):
    from id_registry import embedded_registry

    # a registry of its own: the rounds' click ids are not the other tests' business
    with embedded_registry(str(tmp_path / "registry")) as service:
        check = PhotonCheck(tmp_path, service.url, str(service.data_dir) + "/secret", seed=seed, settings=CheckSettings(), say=print)
        results = list(check.run(rounds))
    for r in results:
        print(r.line())
    (tmp_path / "check.json").write_text(json.dumps([r.counts.line() for r in results]))
    return results


@pytest.mark.spark
@pytest.mark.timeout(1800)
def test_one_round_of_the_check_loses_and_duplicates_nothing(tmp_path):
    (result,) = _rounds(tmp_path, 1, seed=7)
    assert result.counts.ok, result.line()
    assert result.counts.joinable > 50


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(36_000)
def test_twenty_rounds_of_the_check(tmp_path):
    results = _rounds(tmp_path, 20, seed=11)
    assert all(r.counts.ok for r in results), "\n".join(r.line() for r in results if not r.counts.ok)
