"""The replicated backend on a real etcd cluster (three members on loopback, Raft).

The commit, GC, resharding and clear semantics run on etcd too (``store`` in the other
files); here: the cluster losing its leader to kill -9 while two registry servers commit
the same ids for two pipelines. No acknowledged commit may be lost and no id may be
committed under two tokens.
"""

from __future__ import annotations

import threading
import time

import pytest

from id_registry import BackendUnavailableError, EtcdBackend, Registry, RegistryError, Status
from id_registry.client import start_registry
from id_registry.testing import LocalEtcdCluster, etcd_binary

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(
        etcd_binary() is None,
        reason="etcd is not installed (scripts/setup.sh --test installs Debian's etcd-server; CI has it)",
    ),
]


@pytest.mark.timeout(240)
def test_killing_the_leader_mid_stream_loses_nothing_and_admits_no_duplicate(tmp_path):
    with LocalEtcdCluster(tmp_path / "etcd") as cluster:
        prefix = "leader-kill/"
        # registry server 1: the real service on etcd; registry server 2: a registry in this process
        svc = start_registry(
            str(tmp_path / "svc"),
            extra_args=[
                "--backend",
                "etcd",
                "--etcd-prefix",
                prefix,
                *[a for e in cluster.endpoints for a in ("--etcd-endpoint", e)],
            ],
        )
        local = Registry(EtcdBackend(cluster.endpoints, prefix=prefix, timeout=60.0))
        acked: dict[str, dict[str, str]] = {
            "dc1": {},
            "dc2": {},
        }  # pipeline -> {id: token} answered COMMITTED
        batches = [0, 0]  # batches acknowledged by each pipeline
        retried = [0]
        stop = threading.Event()
        errors: list[BaseException] = []

        def pipeline(k: int, commit) -> None:
            name = f"dc{k + 1}"
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    # both pipelines read the same clicks, dc2 a little behind: most ids are contested
                    batch = [(f"click-{n}-{i}", f"{name}/joiner", 1_000 + n) for i in range(60)]
                    while True:
                        try:
                            out = commit(batch)
                            break
                        except RegistryError:  # the joiner retries with the same token (§3.3.2)
                            retried[0] += 1
                            time.sleep(0.1)
                    for (i, t, _), r in zip(batch, out, strict=True):
                        if r.committed:
                            acked[name][i] = t
                        else:
                            assert r.status is Status.CONFLICT and r.holder != t, r
                    batches[k] += 1
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        with svc.client(timeout=60.0, retries=10) as http:
            threads = [
                threading.Thread(target=pipeline, args=(0, http.commit_many)),
                threading.Thread(target=pipeline, args=(1, local.commit_many)),
            ]
            for t in threads:
                t.start()
            try:
                deadline = time.monotonic() + 60
                while min(batches) < 3 and time.monotonic() < deadline:
                    time.sleep(0.02)
                leader = cluster.leader()
                cluster.kill(leader)  # kill -9 while both pipelines commit
                killed_at = list(batches)
                deadline = time.monotonic() + 90
                while (
                    not all(b >= k + 5 for b, k in zip(batches, killed_at, strict=True))
                    and time.monotonic() < deadline
                    and not errors
                ):
                    time.sleep(0.05)
                assert not errors, errors
                assert all(b >= k + 5 for b, k in zip(batches, killed_at, strict=True)), (
                    batches,
                    killed_at,
                    cluster.logs()[-2000:],
                )
                assert cluster.leader() != leader
            finally:
                stop.set()
                for t in threads:
                    t.join(90)
                svc.stop()
        assert not errors, errors

        both = set(acked["dc1"]) & set(acked["dc2"])
        assert not both, f"{len(both)} ids committed by both pipelines, e.g. {sorted(both)[:3]}"
        assert len(acked["dc1"]) + len(acked["dc2"]) > 0
        # every acknowledged commit is in the surviving majority, under its token
        reader = Registry(
            EtcdBackend([e for i, e in enumerate(cluster.endpoints) if i != leader], prefix=prefix)
        )
        expected = {**acked["dc1"], **acked["dc2"]}
        ids = list(expected)
        found = reader.lookup_many(ids)
        assert [(f.status, f.token) for f in found] == [(Status.FOUND, expected[i]) for i in ids]
        local.close()
        reader.close()


def test_a_registry_sending_larger_transactions_than_the_cluster_takes_says_what_to_set(
    etcd_cluster,
):
    backend = EtcdBackend(
        etcd_cluster.endpoints,
        prefix=f"too-many-{time.monotonic_ns()}/",
        max_txn_ops=1024,
        timeout=5.0,
    )
    registry = Registry(backend)
    with pytest.raises(BackendUnavailableError, match=r"too many operations.*--etcd-max-txn-ops"):
        registry.commit_many([(f"x{i}", "t", 1_000) for i in range(500)])
    assert (
        registry.lookup_many(["x0"])[0].status is Status.NOT_FOUND
    )  # refused whole: nothing stored
    registry.close()


def test_two_registry_servers_on_one_cluster_see_each_others_metadata(etcd_cluster):
    """A GC boundary or shard configuration set through one server binds the other at once (§2.2.2, §2.3)."""
    prefix = f"two-servers-{time.monotonic_ns()}/"
    now = [10_000_000]
    a = Registry(EtcdBackend(etcd_cluster.endpoints, prefix=prefix), clock=lambda: now[0])
    b = Registry(EtcdBackend(etcd_cluster.endpoints[::-1], prefix=prefix), clock=lambda: now[0])
    assert b.commit_many([("c1", "dc2", 1_000)])[0].committed
    a.advance_gc(2_000)
    assert (
        b.commit_many([("c2", "dc2", 1_500)])[0].status is Status.TOO_OLD
    )  # b's cached boundary was stale
    a.reshard(now[0] + 60_000, 5)
    now[0] += 120_000
    assert b.commit_many([("c3", "dc2", now[0])])[0].committed
    assert a.commit_many([("c3", "dc1", now[0])])[0] == (
        Status.CONFLICT,
        "dc2",
    )  # both servers put c3 in the same shard
    assert b.shard_configs() == a.shard_configs()
    a.close()
    b.close()


class _SlowGroupEtcd(EtcdBackend):
    """An :class:`EtcdBackend` that runs ``between()`` once, after the first transaction of a commit group succeeded."""

    between = None

    def _txn(self, body):
        out = super()._txn(body)
        hook = self.between
        if (
            hook is not None
            and out.get("succeeded")
            and any("request_txn" in op for op in body.get("success", []))
        ):
            self.between = None
            hook()
        return out


def test_a_group_partly_applied_when_another_server_moves_the_boundary_answers_what_it_stored(
    etcd_cluster,
):
    """The retry after a metadata change, on etcd: a group cut into transactions (2 ids each, one at a time);
    after the first, another server moves the GC boundary past every item, so the rest is refused
    (the metadata compare) and retried. The two ids the first transaction stored are COMMITTED to
    the group's token; before, the retry answered TOO_OLD for them: registered, never written."""
    prefix = f"partly-applied-{time.monotonic_ns()}/"
    now = 10_000_000
    a = Registry(
        _SlowGroupEtcd(etcd_cluster.endpoints, prefix=prefix, max_txn_ops=4, parallel=1),
        clock=lambda: now,
    )
    b = Registry(EtcdBackend(etcd_cluster.endpoints, prefix=prefix), clock=lambda: now)
    a.backend.between = lambda: b.set_gc_boundary(2_000)
    items = [(f"c{i}", "dc1/b7", 1_000 + i) for i in range(6)]
    out = a.commit_many(items)
    assert a.meta.gc_boundary_ms == 2_000
    assert [x.status for x in out] == [Status.COMMITTED] * 2 + [Status.TOO_OLD] * 4
    assert [(x.status, x.token) for x in a.lookup_many([i for i, _, _ in items])] == [
        (Status.TOO_OLD, "dc1/b7")
    ] * 2 + [(Status.NOT_FOUND, None)] * 4
    a.close()
    b.close()
