"""The joiner (topologies/photon/joiner.py): EventStore, retries, unjoinable rule, adapter, once-ids (Photon §2, §3)."""

from __future__ import annotations

import json

import pytest

from millwheel import MAX_TIMESTAMP, Record, Stage, TimeDomain, Timer
from millwheel._once import MemoryOnceRegistry
from topologies.photon import Adapter, PhotonConfig


def _joined(h):
    return [(j["click_id"], j["query_id"]) for j in h.values("joined_clicks")]


def _advance(h, to):
    h.advance_watermark("queries", to)
    h.advance_watermark("clicks", to)
    h.run()


def test_a_click_logged_before_its_query_joins_when_the_query_arrives(joiner, query, click):
    h = joiner()
    h.inject("clicks", [click("c1", "q1", 1_500)])
    h.run()
    assert h.values("joined_clicks") == [] and h.values("unjoinable") == []
    h.inject("queries", [query("q1", 1_000, ad_text="buy flowers")])
    h.run()
    [j] = h.values("joined_clicks")
    assert j == {
        "click_id": "c1",
        "query_id": "q1",
        "ad_slot": 1,
        "advertiser_id": "adv-1",
        "ad_text": "buy flowers",
        "query_ts": 1_000,
        "click_ts": 1_500,
    }
    assert h.output("joined_clicks")[0].timestamp == 1_500
    assert h.timers("Joiner", "q1") == [
        Timer("evict", 61_000, TimeDomain.LOW_WATERMARK)
    ]  # only the cache entry is left


def test_a_click_after_its_query_joins_at_once_and_duplicates_are_dropped(joiner, query, click):
    h = joiner()
    h.inject("queries", [query("q1", 1_000)])
    h.inject(
        "clicks", [click("c1", "q1", 1_200), click("c2", "q1", 1_300), click("c1", "q1", 1_200)]
    )
    h.run()
    assert _joined(h) == [("c1", "q1"), ("c2", "q1")]
    assert h.metrics("Joiner")["duplicates"] == 1
    assert h.registry.holder("c1") is not None  # committed to the IdRegistry (§2)


def test_an_orphan_is_unjoinable_once_the_low_watermark_passes_click_ts_plus_max_delay(
    joiner, click
):
    h = joiner(PhotonConfig(log_store=False, max_delay_ms=10_000))
    h.inject("clicks", [click("c1", "q-never", 1_000)])
    _advance(h, 10_999)
    assert h.values("unjoinable") == []
    assert h.low_watermark("Joiner") <= 1_000  # the waiting click holds the output watermark
    _advance(h, 11_000)
    [u] = h.values("unjoinable")
    assert (
        u["reason_code"] == "no_query"
        and u["click"]["click_id"] == "c1"
        and "q-never" in u["reason"]
    )
    assert h.output("unjoinable")[0].timestamp == 1_000
    assert (
        h.keys("Joiner") == [] or h.state("Joiner", "q-never") is None
    )  # nothing kept for the key
    assert h.registry.holder("c1") is not None  # the click's fate is decided once, across pipelines


def test_a_query_later_than_its_declared_lateness_still_joins_within_max_delay(
    joiner, query, click
):
    h = joiner(PhotonConfig(log_store=False, max_delay_ms=10_000))
    h.inject("clicks", [click("c1", "q1", 5_000)])
    _advance(h, 8_000)
    h.inject("queries", [query("q1", 4_000)])  # behind the low watermark: late, and processed
    h.run()
    assert _joined(h) == [("c1", "q1")]
    assert h.metrics("Joiner")["late"] == 1


def test_retries_back_off_exponentially_and_find_the_query_in_the_logs(joiner, click, tmp_path):
    """The dispatcher's retries (§3.2.1) on wall-time timers; a retry finds the query in the
    query logs (LogsEventStore, §3.4.2) before the query reader has delivered it."""
    qid = "10.0.0.1:4000:1700000000000:1"
    log = tmp_path / "queries_1700000000000.jsonl"
    log.write_text("")
    h = joiner(
        PhotonConfig(backoff_initial_ms=500, backoff_max_ms=2_000),
        queries_dir=tmp_path,
        wall_time=0,
    )
    h.inject("clicks", [click("c1", qid, 1_700_000_000_400)])
    h.run()
    walls = [t.timestamp for t in h.timers("Joiner", qid) if t.domain is TimeDomain.WALL_TIME]
    retries = [walls[0]]
    for now in (500, 1_500, 3_500, 5_500):
        h.advance_wall_time(to=now)
        h.run()
        retries += [
            t.timestamp for t in h.timers("Joiner", qid) if t.domain is TimeDomain.WALL_TIME
        ]
    assert retries == [500, 1_500, 3_500, 5_500, 7_500]  # 500, 1000, 2000, then capped at 2000
    log.write_text(
        json.dumps({"query_id": qid, "ts": 1_700_000_000_000, "advertiser_id": "adv-9"}) + "\n"
    )
    h.advance_wall_time(to=7_500)
    h.run()
    assert [j["advertiser_id"] for j in h.values("joined_clicks")] == ["adv-9"]
    assert h.timers("Joiner", qid) == [
        Timer("evict", 1_700_000_060_000, TimeDomain.LOW_WATERMARK)
    ]  # now cached


def test_the_cache_is_bounded_by_the_low_watermark_and_the_log_store_serves_misses(
    joiner, click, tmp_path
):
    qid = "10.0.0.1:4000:1700000000000:1"
    q = {"query_id": qid, "ts": 1_700_000_000_000, "advertiser_id": "adv-2"}
    (tmp_path / "queries_1700000000000.jsonl").write_text(json.dumps(q) + "\n")
    cfg = PhotonConfig(retention_ms=1_000, max_delay_ms=1_000)
    for store in (False, True):
        h = joiner(PhotonConfig(**{**cfg.__dict__, "log_store": store}), queries_dir=tmp_path)
        h.inject("queries", [Record(None, q, q["ts"], qid)])
        _advance(h, 1_700_000_001_000)
        assert h.keys("Joiner") == [] or h.state("Joiner", qid) is None  # evicted: retention passed
        h.inject("clicks", [click("c1", qid, 1_700_000_000_500)])  # late: behind the watermark
        h.run()
        _advance(h, MAX_TIMESTAMP - 1)
        if store:
            assert _joined(h) == [("c1", qid)] and h.values("unjoinable") == []
        else:
            assert _joined(h) == [] and [u["reason_code"] for u in h.values("unjoinable")] == [
                "no_query"
            ]


class _Business(Adapter):
    def join(self, query, click):
        if query["advertiser_id"] == "blocked":
            return None
        if query["advertiser_id"] == "broken":
            msg = "no price for this advertiser"
            raise ValueError(msg)
        return {
            "click_id": click["click_id"],
            "advertiser_id": query["advertiser_id"],
            "price": 2 * click["ad_slot"],
        }


def test_the_adapter_holds_the_business_logic_and_one_bad_click_stops_nothing(joiner, query, click):
    h = joiner(adapter=_Business(), raise_errors=False)
    h.inject(
        "queries",
        [
            query("q1", 1_000, advertiser_id="ok"),
            query("q2", 1_000, advertiser_id="blocked"),
            query("q3", 1_000, advertiser_id="broken"),
        ],
    )
    h.inject(
        "clicks", [click("c1", "q1", 1_100), click("c2", "q2", 1_100), click("c3", "q3", 1_100)]
    )
    h.run()
    assert h.values("joined_clicks") == [{"click_id": "c1", "advertiser_id": "ok", "price": 2}]
    assert [(u["click"]["click_id"], u["reason_code"]) for u in h.values("unjoinable")] == [
        ("c2", "adapter_skipped")
    ]
    [dead] = [r.value for r in h.dead_letters()]
    assert (
        dead.stage == Stage.PROCESS_RECORD and dead.record.id == "c3" and "no price" in dead.reason
    )


def test_bad_clicks_are_dead_letters_with_their_reason(joiner, query, click):
    h = joiner(raise_errors=False)
    h.inject("queries", [query("q1", 1_000)])
    no_query_id = Record(None, {"click_id": "c9", "ts": 1_100}, 1_100, "c9")
    h.inject(
        "clicks", [click("x7", "q1", 1_100, click_id=7), no_query_id, click("c1", "q1", 1_200)]
    )
    h.run()
    assert _joined(h) == [("c1", "q1")]
    letters = {d.value.record.id: d.value for d in h.dead_letters()}
    assert letters["c9"].stage == Stage.KEY_EXTRACTOR and "query_id" in letters["c9"].reason
    assert (
        letters["x7"].stage == Stage.PROCESS_RECORD
        and "'click_id' must be a non-empty string, got 7" in letters["x7"].reason
    )


def test_a_click_beyond_the_dedup_horizon_is_judged_by_the_registry(joiner, query, click):
    # before: a click log shipped later than dedup_slack_ms lost its clicks for good
    # (``unjoinable``, ``too_old``, never recovered); the registry deduplicates for days
    h = joiner(PhotonConfig(log_store=False, dedup_slack_ms=1_000))
    h.inject("queries", [query("q1", 8_000)])
    _advance(h, 10_000)
    h.inject(
        "clicks", [click("c1", "q1", 8_500)]
    )  # 1.5 s behind: beyond what the pipeline remembers
    h.run()
    assert _joined(h) == [("c1", "q1")] and h.values("unjoinable") == []
    # the same click again, long after the pipeline forgot its id: the registry says no
    _advance(h, 60_000)
    h.inject("clicks", [click("c2", "q1", 59_500)])  # a step of the key: its dedup forgets c1
    h.run()
    h.inject("clicks", [click("c1", "q1", 8_500)])
    h.run()
    assert _joined(h) == [("c1", "q1"), ("c2", "q1")]
    m = h.metrics("Joiner")
    assert (m["duplicates"], m["once_conflicts"]) == (0, 1), (
        m
    )  # not the pipeline's dedup: the registry


def test_a_reinjected_click_joins_without_its_reinjection_id(joiner, query):
    h = joiner(reinjected=True)
    h.inject("queries", [query("q1", 1_000)])
    _advance(h, 30_000)  # the click is late: re-injected clicks always are
    h.inject(
        "reinjected",
        [
            Record(
                None,
                {"click_id": "c1", "query_id": "q1", "ts": 1_100, "reinject_id": "c1@5"},
                1_100,
                "c1@5",
            )
        ],
    )
    h.run()
    [j] = h.values("joined_clicks")
    assert j["click_id"] == "c1" and "reinject_id" not in j


def test_two_pipelines_sharing_a_registry_write_each_click_once(joiner, query, click):
    """Photon §2: both pipelines join the click; only the first commit of its id is written."""
    reg = MemoryOnceRegistry()
    dc1, dc2 = joiner(registry=reg, pipeline="dc1"), joiner(registry=reg, pipeline="dc2")
    for h in (dc1, dc2):
        h.inject("queries", [query("q1", 1_000)])
        h.inject("clicks", [click("c1", "q1", 1_100)])
        h.run()
    assert _joined(dc1) == [("c1", "q1")] and _joined(dc2) == []
    assert dc2.metrics("Joiner")["once_conflicts"] == 1
    dc1.inject(
        "clicks", [click("c1", "q1", 1_100)]
    )  # a re-delivery to the winner: deduplicated, not re-committed
    dc1.run()
    assert _joined(dc1) == [("c1", "q1")]


@pytest.mark.parametrize("joins_first", [False, True])
def test_giving_up_in_one_pipeline_does_not_block_the_join_in_another(
    joins_first, joiner, query, click
):
    # before: dc1's query log is late; it gave up on c1 first and took the click id, so
    # dc2, which had the query, got a conflict and the joinable click was never joined
    from millwheel._once import MemoryOnceRegistry, holder_of

    registry = MemoryOnceRegistry()
    cfg = PhotonConfig(log_store=False, max_delay_ms=5_000)
    dc1, dc2 = (
        joiner(cfg, registry=registry, pipeline="dc1"),
        joiner(cfg, registry=registry, pipeline="dc2"),
    )

    def dc1_gives_up():
        dc1.inject("clicks", [click("c1", "q1", 1_000)])
        _advance(dc1, 10_000)  # no query by click ts + max_delay_ms

    def dc2_joins():
        dc2.inject("queries", [query("q1", 900)])
        dc2.inject("clicks", [click("c1", "q1", 1_000)])
        dc2.run()

    for step in (dc2_joins, dc1_gives_up) if joins_first else (dc1_gives_up, dc2_joins):
        step()
    assert _joined(dc2) == [("c1", "q1")]
    assert holder_of(registry.holder("c1")) == dc2.pipeline_id  # the join holds the id
    gave_up = [u["click"]["click_id"] for u in dc1.values("unjoinable")]
    assert gave_up == ([] if joins_first else ["c1"])  # reported only if nobody had joined it yet
    assert dc2.metrics("Joiner")["once_conflicts"] == 0
