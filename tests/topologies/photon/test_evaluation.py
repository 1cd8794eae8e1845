"""The evaluation (topologies/photon/evaluation.py): the batch join in pandas, and rules that can fail."""

from __future__ import annotations

import copy

from topologies.photon import batch_join, evaluate
from topologies.photon.evaluation import render


def test_the_batch_join_accounts_for_every_click(sample, truth):
    answer = batch_join(sample)
    assert len(answer.joined) + len(answer.orphans) == truth["clicks"]
    assert answer.orphans == set(truth["orphans"])
    assert answer.malformed_lines == truth["malformed_injected"]
    assert answer.duplicate_clicks == truth["duplicate_clicks"]
    j = answer.joined[0]
    assert set(j) == {
        "click_id",
        "query_id",
        "ad_slot",
        "advertiser_id",
        "ad_text",
        "terms",
        "query_ts",
        "click_ts",
    }


def test_each_rule_fails_when_it_should(batch, sample, truth):
    assert evaluate(batch, sample, truth)["ok"]
    dup = copy.deepcopy(batch)
    dup.joined.append(dup.joined[0])
    assert evaluate(dup, sample, truth)["duplicates_in_output"] == 1
    lost = copy.deepcopy(batch)
    lost.joined.pop()
    r = evaluate(lost, sample, truth)
    assert not r["ok"] and r["joined"]["missing"] == 1
    changed = copy.deepcopy(batch)
    changed.joined[0]["ad_slot"] = 99
    assert not evaluate(changed, sample, truth)["exact_match"]
    no_orphans = copy.deepcopy(batch)
    no_orphans.unjoinable = []
    assert not evaluate(no_orphans, sample, truth)["orphans"]["all_in_unjoinable"]
    no_dead = copy.deepcopy(batch)
    no_dead.dead_letters.pop()
    assert not evaluate(no_dead, sample, truth)["dead_letters"]["match"]


def test_a_click_twice_in_unjoinable_fails_the_evaluation(batch, sample, truth):
    # before: only joined_clicks was counted; the same orphan twice in unjoinable (a re-injection
    # into a pipeline that had already given it up) passed
    twice = copy.deepcopy(batch)
    twice.unjoinable.append(twice.unjoinable[0])
    r = evaluate(twice, sample, truth)
    assert r["duplicates_in_unjoinable"] == 1 and not r["ok"]
    assert "duplicates in unjoinable 1" in render(r)
