"""Sequencer tokens fence zombies (MillWheel §6.2, §7.1, §7.2)."""

from __future__ import annotations

import pytest

from watermark_authority import StaleTokenError, UnknownNameError


def test_a_new_acquire_fences_the_old_owner(client, ns):
    c = f"{ns}counter"
    old = client.acquire(c, "a")
    client.report(c, "a", old, 1_000)
    new = client.acquire(c, "a")
    assert new > old
    with pytest.raises(StaleTokenError) as err:
        client.report(c, "a", old, 9_000)  # the zombie's late report
    assert "stale sequencer token" in str(err.value) and "'a'" in str(err.value)
    assert err.value.intervals == [(c, "a")]
    assert client.watermark(c) == 1_000  # changed nothing
    client.report(c, "a", new, 2_000)
    assert client.watermark(c) == 2_000


def test_a_batch_with_one_stale_token_changes_nothing(client, ns):
    c = f"{ns}counter"
    tokens = client.acquire_many(c, ["a", "b", "c"])
    client.report_batch(c, [(iv, t, 100) for iv, t in tokens.items()])
    assert client.watermark(c) == 100
    client.acquire(c, "b")  # b moves to another worker
    with pytest.raises(StaleTokenError) as err:
        client.report_batch(c, [(iv, t, 500) for iv, t in tokens.items()])
    assert err.value.intervals == [(c, "b")]
    assert client.watermark(c) == 100  # a and c were not applied either


def test_tokens_grow_across_intervals_and_computations(client, ns):
    seen = [
        client.acquire(f"{ns}x", "a"),
        client.acquire(f"{ns}y", "a"),
        client.acquire(f"{ns}x", "a"),
        client.acquire(f"{ns}x", "b"),
    ]
    assert seen == sorted(seen) and len(set(seen)) == 4


def test_check_token_fences_log_writes(client, ns):
    c = f"{ns}counter"
    old = client.acquire(c, "a")
    client.check_token(c, "a", old)
    new = client.acquire(c, "a")
    client.check_token(c, "a", new)
    with pytest.raises(StaleTokenError):
        client.check_token(c, "a", old)


def test_reporting_an_interval_never_acquired_says_acquire_first(client, ns):
    c = f"{ns}counter"
    token = client.acquire(c, "a")
    with pytest.raises(UnknownNameError, match="acquire"):
        client.report(c, "zz", token, 5)
    with pytest.raises(UnknownNameError, match="acquire an interval"):
        client.report(f"{ns}nobody", "a", token, 5)


def test_a_split_or_merge_fences_the_old_owner(client, ns):
    c = f"{ns}counter"
    t = client.acquire(c, "a-z")
    parts = client.split(c, "a-z", ["a-m", "n-z"])
    with pytest.raises(StaleTokenError, match="split or merged away"):
        client.report(c, "a-z", t, 10)
    merged = client.merge(c, ["a-m", "n-z"], "a-z")
    assert merged > max(parts.values())
    with pytest.raises(StaleTokenError):
        client.report(c, "a-m", parts["a-m"], 10)
    client.report(c, "a-z", merged, 10)
    with pytest.raises(StaleTokenError):
        client.report(c, "a-z", t, 10)  # the name is back, the old token is not
