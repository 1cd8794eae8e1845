"""A click delivered again after its key was collected is not billed twice (issue 35, observation 1).

The joiner forgets a query's key once the low watermark passes its retention and its dedup
horizon. A production's identity outlives that (``millwheel/_identity.py``): the click
joined again later is a new production with another once-token, so the IdRegistry answers
``CONFLICT`` instead of taking it for a replay (Photon §2).
"""

from __future__ import annotations

from millwheel._once import MemoryOnceRegistry
from millwheel.testing import Crash
from topologies.photon import PhotonConfig

#: far past the query's retention (60 s) and the joiner's dedup horizon (600 s)
FAR = 10_000_000


def _settle(h, to):
    for stream in ("queries", "clicks"):
        h.advance_watermark(stream, to)
    h.run()


def test_a_click_delivered_again_after_its_key_was_collected_is_not_joined_twice(
    joiner, query, click
):
    h = joiner(PhotonConfig(log_store=False), registry=MemoryOnceRegistry())
    h.inject("queries", [query("q1", 1_000)])
    h.inject("clicks", [click("c1", "q1", 1_500)])
    h.run()
    first = h.output("joined_clicks")
    assert [j["click_id"] for j in h.values("joined_clicks")] == ["c1"]
    _settle(h, FAR)
    assert h.keys("Joiner") == []  # the key is collected: nothing kept, not even its sequence
    h.inject("queries", [query("q1", 1_000)])  # the logs shipped again
    h.inject("clicks", [click("c1", "q1", 1_500)])
    h.run()
    _settle(h, 2 * FAR)
    m = h.metrics("Joiner")
    assert [j["click_id"] for j in h.values("joined_clicks")] == ["c1"], (
        "the click was billed twice"
    )
    assert (m["once_committed"], m["once_conflicts"]) == (1, 1)
    assert h.values("unjoinable") == []
    assert h.output("joined_clicks") == first


def test_a_replayed_round_still_commits_with_the_token_of_its_crashed_attempt(joiner, query, click):
    """The other half of the identity: the round that joins the click again crashes after
    its registry commit and before its checkpoint; the replay makes the same production
    (same id, same token), so it is the registry's ``CONFLICT`` again — not a third answer —
    and a click joined for the first time in a crashed round is still written by its replay."""
    registry = MemoryOnceRegistry()
    h = joiner(PhotonConfig(log_store=False), registry=registry)
    h.inject("queries", [query("q1", 1_000)])
    h.inject("clicks", [click("c1", "q1", 1_500)])
    h.run()
    _settle(h, FAR)
    h.inject("queries", [query("q1", 1_000), query("q2", FAR + 1)])
    h.inject("clicks", [click("c1", "q1", 1_500), click("c2", "q2", FAR + 5)])
    h.process("Joiner", crash=Crash.BEFORE_COMMIT)  # committed to the registry, then died
    held = registry.holder("c2")
    h.restart("Joiner")
    h.run()
    assert registry.holder("c2") == held  # the replay committed with the same token
    assert sorted(j["click_id"] for j in h.values("joined_clicks")) == ["c1", "c2"]
    assert (
        len({r.id for r in h.output("joined_clicks")}) == 2
    )  # c2's weak re-send dropped downstream by its id
