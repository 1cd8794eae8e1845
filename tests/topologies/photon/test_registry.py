"""The IdRegistry as the backends use it (topologies/photon/registry.py): the adapter and the worker factory."""

from __future__ import annotations

import pickle
from pathlib import Path

from millwheel._once import OnceResult
from topologies.photon.registry import OnceRegistryAdapter, RegistryFactory


def test_the_adapter_answers_once_results_and_passes_lookups_and_clears_through(registry):
    assert registry.commit_many([("c1", "dc1", 10), ("c1", "dc1", 10), ("c1", "dc2", 10)]) == [
        OnceResult.COMMITTED,
        OnceResult.COMMITTED,
        OnceResult.CONFLICT,
    ]
    [found] = registry.lookup_many(["c1"])
    assert found.status.value == "found" and found.token == "dc1"
    [cleared] = registry.clear_many(["c1"], only_if_token="dc1", keep_id=True)
    assert cleared.status.value == "cleared"
    assert registry.commit_many([("c1", "dc1", 10)]) == [
        OnceResult.CONFLICT
    ]  # the id still refuses every commit


def test_the_factory_is_picklable_and_opens_an_http_client_per_worker(registry_service):
    factory = RegistryFactory(registry_service.url, str(Path(registry_service.data_dir) / "secret"))
    copy = pickle.loads(pickle.dumps(factory))
    assert (
        "secret" not in pickle.dumps(factory).decode("latin-1").split("secret_file")[0]
    )  # the path travels, not the secret
    reg = copy()
    try:
        assert isinstance(reg, OnceRegistryAdapter)
        assert reg.commit_many([("factory-c1", "dc1", 1_000)]) == [OnceResult.COMMITTED]
        assert reg.commit_many([("factory-c1", "dc2", 1_000)]) == [OnceResult.CONFLICT]
    finally:
        reg.close()


def test_too_old_events_are_too_old(registry):
    registry.client.advance_gc(5_000)
    assert registry.commit_many([("old", "dc1", 4_999), ("new", "dc1", 5_000)]) == [
        OnceResult.TOO_OLD,
        OnceResult.COMMITTED,
    ]
