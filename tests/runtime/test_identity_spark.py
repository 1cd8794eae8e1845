"""A production's identity on Spark, in every plan (``millwheel/_identity.py``, ``runtime/_life.py``).

One small run per plan — per-record computation on interval rows and on per-key rows
(``transformWithStateInPandas``), columnar on the default mapping and on the Arrow
mapping — of ``identity_topology`` (``tests/conftest.py``), in lockstep with a scripted
source: record ``a`` of key ``k``; a far watermark, so ``k``'s timer fires, its dedup ids
are collected and the key is forgotten; ``a`` shipped again (late, processed). The
registry is shared by the driver and the workers (a directory) and fails once, right
after it committed the re-delivery's once-id, so that batch runs again.

* the re-delivery is a new production: another id than the first delivery's, and the
  consumer, which still remembers the first id, receives it;
* the replayed batch reproduces its ids: the re-delivery's once-id was committed twice
  (the failed attempt and the replay) with one token, ``COMMITTED`` both times, and
  published once.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter, defaultdict

import pytest
import xxhash

from millwheel import MAX_TIMESTAMP, Record, Source, SourceBatch
from millwheel._once import OnceResult
from millwheel.runtime import RuntimeSettings, SparkRuntime

pytestmark = pytest.mark.spark

T0 = 1_767_261_600_000
#: far past the timer (50 ms) and the dedup horizon (1 s)
FAR = 1_000_000
#: the re-delivery's tag: the registry fails once right after committing it
AGAIN = "a#2"


class Scripted(Source):
    """Source batches with the watermarks the test gives them."""

    def __init__(self, batches: list[tuple[list[Record], int]]) -> None:
        self.script = batches

    def batches(self, injector="injector", stream="records"):
        for records, wm in self.script:
            yield SourceBatch(records, wm)


class DirectoryRegistry:
    """An IdRegistry in a directory, for the driver's and the workers' processes: a once-id is a
    file holding its token (made by ``link``: first token wins); every commit is journaled.
    It fails once (``fail_after``): right after committing that once-id, as a connection lost
    with the answer."""

    def __init__(self, root: str, fail_after: str) -> None:
        self.root = root
        self.fail_after = fail_after

    def __call__(self) -> DirectoryRegistry:
        return self

    def commit_many(self, items):
        out = []
        with open(os.path.join(self.root, "journal"), "a") as journal:
            for rid, token, _ in items:
                path = os.path.join(self.root, xxhash.xxh3_64_hexdigest(rid.encode()))
                tmp = f"{path}.{uuid.uuid4().hex}"
                with open(tmp, "w") as f:
                    f.write(token)
                try:
                    os.link(tmp, path)
                    result = OnceResult.COMMITTED
                except FileExistsError:
                    with open(path) as f:
                        result = OnceResult.COMMITTED if f.read() == token else OnceResult.CONFLICT
                os.unlink(tmp)
                journal.write(json.dumps([rid, token, result.value]) + "\n")
                out.append(result)
        failed = os.path.join(self.root, "failed")
        if any(rid == self.fail_after for rid, _, _ in items) and not os.path.exists(failed):
            open(failed, "w").close()
            msg = "the IdRegistry's connection was lost after it committed (injected by the test)"
            raise ConnectionError(msg)
        return out

    def journal(self) -> list[tuple[str, str, str]]:
        with open(os.path.join(self.root, "journal")) as f:
            return [tuple(json.loads(line)) for line in f]


PLANS = {
    "interval_rows": {"columnar": False, "layout": "intervals"},
    "per_key_rows": {"columnar": False, "layout": "keys"},
    "columnar_default": {"columnar": True, "layout": "intervals"},
    "columnar_arrow": {"columnar": True, "layout": "intervals", "mapping": "arrow"},
}


@pytest.mark.parametrize("plan", list(PLANS))
def test_a_key_collected_and_delivered_again_gets_new_ids_and_a_replayed_batch_the_same(
    plan, spark, tmp_path, identity_topology
):
    p = PLANS[plan]

    def rec(key, tag, ts, rid):
        return Record(None, {"key": key, "tag": tag}, ts, rid)

    source = Scripted(
        [
            ([rec("k", "a#1", T0, "a")], T0),
            # k's timer fires, in a batch without records (a columnar run collects ids behind the
            # oldest watermark its records arrived under): k's ids are collected, k is forgotten
            ([], T0 + FAR),
            ([rec("k", AGAIN, T0, "a")], T0 + FAR),  # a shipped again: late, processed
            ([], MAX_TIMESTAMP),
        ]
    )
    (tmp_path / "registry").mkdir()
    registry = DirectoryRegistry(str(tmp_path / "registry"), fail_after=AGAIN)
    topo = identity_topology(
        columnar=p["columnar"], source=source, mapping=p.get("mapping", "default")
    )
    settings = RuntimeSettings(
        drain=True, intervals=2, lockstep=True, state_layout=p["layout"], registry=registry
    )
    rt = SparkRuntime(topo, str(tmp_path / "run"), settings, spark=spark)
    rt.run(timeout_s=600)
    ids: dict[str, set[str]] = defaultdict(set)
    for r in rt.output("out"):
        ids[r.value["tag"]].add(r.id)
    assert set(ids) == {"a#1", "a#1/fired", AGAIN, f"{AGAIN}/fired"}
    assert all(len(v) == 1 for v in ids.values()), (
        f"a production published under two ids: {dict(ids)}"
    )
    assert ids["a#1"] != ids[AGAIN] and ids["a#1/fired"] != ids[f"{AGAIN}/fired"], (
        "the key's new life repeated its old ids"
    )
    assert Counter(rt.values("seen")) == Counter(set(ids)), (
        "the consumer dropped a production as a duplicate"
    )
    assert os.path.exists(
        tmp_path / "registry" / "failed"
    )  # the batch failed after the commit, and ran again
    again = [(token, result) for rid, token, result in registry.journal() if rid == AGAIN]
    assert len(again) >= 2 and len({t for t, _ in again}) == 1, (
        again
    )  # the replay committed with the failed attempt's token
    assert {r for _, r in again} == {OnceResult.COMMITTED.value}
    assert Counter(r.value["tag"] for r in rt.output("out"))[AGAIN] == 1
