"""Conditional commits (Photon §2.1, §3.3.2): first token wins, the same token again succeeds,
another token conflicts and learns the holder, an event before the GC boundary is too old.

Semantics run on every backend (``store``) and on both sides of the wire (``client``).
"""

from __future__ import annotations

import httpx
import pytest

import id_registry._model
import id_registry.client
from id_registry import CommitResult, HttpRegistryClient, InvalidRequestError, Registry, Status
from id_registry._worker import RegistryWorker
from id_registry.client import embedded_registry

C = CommitResult(Status.COMMITTED)


def test_first_commit_wins_and_the_loser_learns_the_holder(store, clock):
    r = Registry(store, clock=clock)
    assert r.commit_many([("click-1", "joiner-a", 1_000)]) == [C]
    assert r.commit_many([("click-1", "joiner-b", 1_000)]) == [
        CommitResult(Status.CONFLICT, "joiner-a")
    ]
    assert r.lookup_many(["click-1"])[0][:2] == (Status.FOUND, "joiner-a")


def test_a_retry_with_the_same_token_commits_again(store, clock):
    """A lost answer, a timed-out RPC or a replayed Spark batch resends the same token: still COMMITTED."""
    r = Registry(store, clock=clock)
    items = [
        (f"click-{i}", "batch-7", 1_000 + i) for i in range(300)
    ]  # more than one etcd transaction
    assert r.commit_many(items) == [C] * 300
    assert r.commit_many(items) == [C] * 300
    assert r.commit_many(list(reversed(items))) == [C] * 300
    assert r.stats.committed == 300 and r.stats.repeated == 600


def test_inside_one_call_the_first_item_of_an_id_wins(store, clock):
    """Application-level conflict resolution inside a batch (§2.2.1)."""
    r = Registry(store, clock=clock)
    out = r.commit_many(
        [("x", "a", 10), ("y", "b", 10), ("x", "b", 10), ("x", "a", 10), ("y", "b", 10)]
    )
    assert out == [C, C, CommitResult(Status.CONFLICT, "a"), C, C]
    assert store.writes <= 2  # the metadata, then one durable write for the whole call


def test_too_old_is_refused_with_its_own_code_and_stores_nothing(store, clock):
    r = Registry(store, clock=clock)
    r.commit_many([("old", "a", 100)])
    r.advance_gc(1_000)
    out = r.commit_many([("new", "a", 999), ("ok", "a", 1_000), ("old", "b", 5)])
    assert out == [CommitResult(Status.TOO_OLD), C, CommitResult(Status.TOO_OLD)]
    assert [x.status for x in r.lookup_many(["new", "ok", "old"])] == [
        Status.NOT_FOUND,
        Status.FOUND,
        Status.NOT_FOUND,
    ]
    assert r.stats.too_old == 2


def test_results_come_back_in_order_for_thousands_of_items(client, ns):
    n = 5_000
    first = [(f"{ns}{i}", "joiner-a" if i % 2 else "joiner-b", 1_000 + i) for i in range(n)]
    assert all(r.committed for r in client.commit_many(first))
    second = [(f"{ns}{i}", "joiner-a", 1_000 + i) for i in range(n)]
    out = client.commit_many(second)
    assert [r.status for r in out] == [
        Status.COMMITTED if i % 2 else Status.CONFLICT for i in range(n)
    ]
    assert {r.holder for r in out if not r.committed} == {"joiner-b"}


def test_client_semantics_on_both_sides(client, ns):
    assert client.commit(f"{ns}a", "t1", 5_000).committed
    assert client.commit(f"{ns}a", "t1", 5_000).committed
    lost = client.commit(f"{ns}a", "t2", 5_000)
    assert (
        lost == CommitResult(Status.CONFLICT, "t1")
        and not lost.committed
        and lost.value == "conflict"
    )
    assert client.lookup_many([f"{ns}a", f"{ns}b"]) == [
        (Status.FOUND, "t1", 5_000),
        (Status.NOT_FOUND, None, None),
    ]
    status = client.status()
    assert status["stats"]["committed"] == 1 and status["stats"]["conflicts"] == 1


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (
            ("", "t", 1),
            "items[1]: an event id must be a non-empty string of at most 256 characters",
        ),
        (("x" * 257, "t", 1), "items[1]: an event id must be"),
        (("x", "", 1), "items[1]: a token must be a non-empty string"),
        (("x", "t", 2**63), "items[1]: event_time_ms must be an integer in"),
        (("x", "t", 1.5), "items[1]: event_time_ms must be an integer"),
        (("x", "t", True), "items[1]: event_time_ms must be an integer"),
        (("x", "t"), "items[1] must be [event_id, token, event_time_ms]"),
        (("x\ud800", "t", 1), "items[1]: an event id must be valid Unicode"),
    ],
)
def test_a_bad_item_refuses_the_whole_call(client, ns, item, says):
    with pytest.raises(InvalidRequestError, match=r".*") as info:
        client.commit_many([(f"{ns}ok", "t", 1), item])
    assert says in str(info.value)
    assert len(str(info.value)) < 400  # never the whole input back
    assert client.lookup_many([f"{ns}ok"])[0].status is Status.NOT_FOUND  # nothing changed


def test_non_ascii_ids_and_tokens_are_fine(client):
    assert client.commit("clic-é-😀", "jöiner", 1_000).committed
    assert client.lookup_many(["clic-é-😀"])[0].token == "jöiner"


def test_a_call_over_the_services_item_bound_is_split_and_answered_in_order(
    serve_app, secret, clock, monkeypatch
):
    """A backlog's commit (one call for every once-id of a batch) larger than the service takes in
    one request is sent as several, one answer per item, in order; lookups and clears too. A
    service refusing it with a 400 the client never retried would refuse it on every replay. The
    bound is lowered on both sides (the real app, served in this process), so a few thousand
    items stand for the hundred thousand of the real bound."""
    bound = 1_000
    monkeypatch.setattr(id_registry._model, "MAX_ITEMS_PER_CALL", bound)
    monkeypatch.setattr(id_registry.client, "MAX_ITEMS_PER_CALL", bound)
    n = 3 * bound + 3
    ns = "bound-"
    items = [(f"{ns}{i}", "joiner-a" if i % 3 else "joiner-b", 1_000 + i) for i in range(n)]
    with (
        serve_app(RegistryWorker(Registry(clock=clock))) as url,
        HttpRegistryClient(url, secret=secret, timeout=60.0) as c,
    ):
        whole = httpx.post(
            f"{url}/v1/commit",
            json={"items": [list(i) for i in items]},
            headers={"Authorization": f"Bearer {secret.reveal()}"},
            timeout=60,
        )
        assert (
            whole.status_code == 400
            and f"send at most {bound:,} per call" in whole.json()["message"]
        )  # the bound holds
        assert all(r.committed for r in c.commit_many(items))
        again = c.commit_many([(f"{ns}{i}", "joiner-a", 1_000 + i) for i in range(n)])
        assert [r.status for r in again] == [
            Status.COMMITTED if i % 3 else Status.CONFLICT for i in range(n)
        ]
        found = c.lookup_many([f"{ns}{i}" for i in range(n)])
        assert [r.token for r in found] == [t for _, t, _ in items]
        cleared = c.clear_many(
            [f"{ns}{i}" for i in range(n)], only_if_token="joiner-b", keep_id=True
        )
        assert [r.status for r in cleared] == [
            Status.TOKEN_MISMATCH if i % 3 else Status.CLEARED for i in range(n)
        ]


def test_a_call_over_a_lowered_body_limit_is_split_under_it(tmp_path, ns):
    """A service started with a smaller ``--max-body-bytes``: a client told so keeps each request under it."""
    items = [
        (f"{ns}{'x' * 200}{i}", "joiner-a", 1_000 + i) for i in range(2_000)
    ]  # ~500 KB of JSON
    with (
        embedded_registry(str(tmp_path), extra_args=["--max-body-bytes", "65536"]) as svc,
        svc.client(max_body_bytes=65_536) as c,
    ):
        assert c.commit_many(items) == [C] * len(items)
        ids = [i for i, _, _ in items] + [items[0][0]]  # a repeated id is answered like its first
        assert [r.status for r in c.clear_many(ids, only_if_token=["joiner-a"] * len(ids))] == [
            Status.CLEARED
        ] * len(ids)
