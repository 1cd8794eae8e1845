"""Time-based sharding (Photon §2.2.2): an id's shard is ``hash(id) % count`` of the configuration
in force at its event time; a new configuration takes effect only from a future time after
every event already decided, so no decided id ever moves (and none can be committed twice)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from id_registry import (
    InvalidRequestError,
    MemoryBackend,
    Registry,
    ReshardError,
    ShardConfig,
    ShardMap,
    Status,
)
from id_registry._model import shard_hash
from servicekit import INT64_MIN

LEAD = 60_000


def test_shard_is_the_hash_modulo_the_count_in_force_at_the_event_time():
    m = ShardMap([ShardConfig(INT64_MIN, 100), ShardConfig(5_200, 120)])  # the paper's example
    for i in range(200):
        h = shard_hash(f"click-{i}".encode())
        assert m.shard_of(f"click-{i}", 5_199) == h % 100
        assert m.shard_of(f"click-{i}", 5_200) == h % 120
    assert m.shard_of("click-1", 5_000) == m.shard_of("click-1", 5_000)  # deterministic


def test_entries_live_under_their_shard_prefix(clock):
    backend = MemoryBackend()
    r = Registry(backend, shard_count=7, clock=clock)
    r.commit_many([("click-1", "a", 1_000)])
    shard = shard_hash(b"click-1") % 7
    assert f"e/{shard}/click-1".encode() in backend.data
    assert [k for k in backend.data if k.startswith(b"e/")] == [f"e/{shard}/click-1".encode()]


def test_a_configuration_must_start_in_the_future(store, clock):
    r = Registry(store, clock=clock)
    with pytest.raises(
        ReshardError, match=f"at least {LEAD} ms ahead .* the earliest is {clock.now + LEAD}"
    ):
        r.reshard(clock.now + LEAD - 1, 32)
    with pytest.raises(ReshardError):
        r.reshard(0, 32)  # re-sharding the past
    assert r.reshard(clock.now + LEAD, 32) == [
        ShardConfig(INT64_MIN, 16),
        ShardConfig(clock.now + LEAD, 32),
    ]
    assert r.reshard(clock.now + LEAD, 32) == r.shard_configs()  # the same again: a no-op
    with pytest.raises(ReshardError, match="only append"):
        r.reshard(clock.now + LEAD - 5, 8)  # before the latest configuration
    assert len(r.shard_configs()) == 2


def test_a_configuration_never_moves_an_event_already_committed(store, clock):
    """An event stamped in the future (clock skew) is already decided: a configuration from before it is refused."""
    r = Registry(store, clock=clock)
    r.commit_many([("skewed", "a", clock.now + 10 * LEAD)])
    with pytest.raises(ReshardError, match=f"latest event time stored is {clock.now + 10 * LEAD}"):
        r.reshard(clock.now + 2 * LEAD, 32)
    r.reshard(clock.now + 10 * LEAD + 1, 32)


def test_bad_configurations_are_refused_by_name(clock):
    r = Registry(clock=clock)
    with pytest.raises(
        InvalidRequestError, match=r"shard_count must be an integer in \[1, 65536\], got 0"
    ):
        r.reshard(clock.now + LEAD, 0)
    with pytest.raises(InvalidRequestError, match="effective_from_ms must be an integer"):
        r.reshard("soon", 2)  # type: ignore[arg-type]


def test_ids_stay_decided_across_a_reshard(store, clock):
    r = Registry(store, shard_count=3, clock=clock)
    before = [(f"c{i}", "a", 1_000 + i) for i in range(100)]
    r.commit_many(before)
    t2 = clock.now + LEAD
    r.reshard(t2, 11)
    clock.now = t2 + 1_000
    after = [(f"d{i}", "a", t2 + i) for i in range(100)]
    r.commit_many(after)
    # every id, before and after, is found and refuses another token
    assert all(x.status is Status.FOUND for x in r.lookup_many([i for i, _, _ in before + after]))
    lost = r.commit_many([(i, "b", t) for i, _, t in before + after])
    assert {x.status for x in lost} == {Status.CONFLICT}


def test_reshard_over_http(client, clock):
    configs = client.reshard(clock.now + LEAD, 4)
    assert configs[-1] == ShardConfig(clock.now + LEAD, 4)
    assert client.shard_configs() == configs
    with pytest.raises(ReshardError):
        client.reshard(clock.now, 8)


@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    ids=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=30, unique=True),
)
def test_no_id_is_committed_twice_whatever_the_resharding(counts, ids):
    """Commit ids, reshard several times, commit them again with another token: never a second COMMITTED."""
    clock = [1_000_000]
    r = Registry(shard_count=counts[0], reshard_lead_ms=100, clock=lambda: clock[0])
    times = {}
    for round_ in range(len(counts)):
        batch = [(i, "a", clock[0] + round_) for i in ids if i not in times]
        for i, _, t in batch[: len(batch) // 2 + 1]:
            times[i] = t
        r.commit_many([(i, "a", times[i]) for i in times])
        clock[0] += 1_000
        if round_ < len(counts) - 1:
            r.reshard(clock[0] + 200, counts[round_ + 1])
        clock[0] += 1_000
    again = r.commit_many([(i, "b", t) for i, t in times.items()])
    assert all(x.status is Status.CONFLICT and x.holder == "a" for x in again)
    assert all(x.status is Status.FOUND for x in r.lookup_many(list(times)))
