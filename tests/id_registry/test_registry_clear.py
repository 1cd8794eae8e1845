"""Verification and recovery (Photon §3.3.3): read tokens, clear a registered click missing from
the output so it can be joined again, drop the tokens of clicks safely in the output."""

from __future__ import annotations

import pytest

from id_registry import ClearResult, InvalidRequestError, Registry, Status


def test_recovery_clears_a_registered_but_missing_click_so_it_can_be_joined_again(store, clock):
    r = Registry(store, clock=clock)
    r.commit_many([("lost", "joiner-dead", 1_000), ("kept", "joiner-ok", 1_000)])
    # the verifier read the token, found its joiner dead: clear only if that joiner still holds it
    assert r.clear_many(["lost", "kept"], only_if_token=["joiner-dead", "joiner-dead"]) == [
        ClearResult(Status.CLEARED),
        ClearResult(Status.TOKEN_MISMATCH, "joiner-ok"),
    ]
    assert r.commit_many([("lost", "joiner-new", 1_000)])[0].committed
    assert r.lookup_many(["kept"])[0].token == "joiner-ok"


def test_dropping_tokens_keeps_the_ids_joined(store, clock):
    r = Registry(store, clock=clock)
    r.commit_many([("a", "t", 1_000), ("b", "t", 1_000)])
    assert r.clear_many(["a", "b", "nope"], keep_id=True) == [ClearResult(Status.CLEARED)] * 2 + [
        ClearResult(Status.NOT_FOUND)
    ]
    assert r.lookup_many(["a"])[0] == (Status.FOUND, None, 1_000)
    assert r.commit_many([("a", "t", 1_000)])[0] == (
        Status.CONFLICT,
        None,
    )  # nobody may join it again
    assert r.clear_many(["a"], keep_id=True) == [ClearResult(Status.CLEARED)]  # again: harmless
    assert r.clear_many(["a"], only_if_token="t") == [ClearResult(Status.TOKEN_MISMATCH, None)]


def test_clear_of_what_is_gone_says_not_found_and_repeats_are_harmless(store, clock):
    r = Registry(store, clock=clock)
    r.commit_many([("a", "t", 1_000)])
    assert r.clear_many(["a", "a", "zz"]) == [
        ClearResult(Status.CLEARED),
        ClearResult(Status.CLEARED),
        ClearResult(Status.NOT_FOUND),
    ]
    assert r.clear_many(["a"]) == [ClearResult(Status.NOT_FOUND)]
    assert r.lookup_many(["a"])[0].status is Status.NOT_FOUND


def test_clear_over_http(client):
    client.commit_many([("a", "t", 1_000), ("b", "u", 1_000)])
    assert client.clear_many(["a", "b"], only_if_token="t") == [
        ClearResult(Status.CLEARED),
        ClearResult(Status.TOKEN_MISMATCH, "u"),
    ]
    assert client.clear_many(["b"], keep_id=True) == [ClearResult(Status.CLEARED)]
    assert [x.status for x in client.lookup_many(["a", "b"])] == [Status.NOT_FOUND, Status.FOUND]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (
            {"only_if_token": ["t"]},
            "only_if_token must be null, a token, or a list of one token (or null) per id (2)",
        ),
        ({"only_if_token": ""}, "only_if_token: a token must be a non-empty string"),
        ({"keep_id": "yes"}, "keep_id must be true or false"),
    ],
)
def test_bad_clear_requests_are_refused_by_name(client, kwargs, says):
    with pytest.raises(InvalidRequestError) as info:
        client.clear_many(["a", "b"], **kwargs)
    assert says in str(info.value)
