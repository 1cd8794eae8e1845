"""The Arrow mapping's versioned state files (``millwheel/runtime/_colfiles.py``), without Spark:
which manifest a batch trusts, what is collected, and the mapping pinned in ``run.json``."""

from __future__ import annotations

import pytest

from millwheel._errors import MillwheelError
from millwheel.runtime._colfiles import ColumnarFiles, Manifest, pin_mapping, store_name
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin


def test_a_manifest_round_trips_and_knows_its_due_intervals():
    m = Manifest(4, 1_000, {0: "a.store", 1: "b.store"}, {0: (900, None), 1: (None, 5_000)})
    assert Manifest.decode(m.encode()) == m
    assert m.due(899, 0) == [] and m.due(900, 0) == [0] and m.due(0, 5_000) == [1]
    nxt = m.after(5, 1_200, [(0, None, None, None), (2, "c.store", 2_000, None)])
    assert nxt.files == {1: "b.store", 2: "c.store"} and nxt.timers == {
        1: (None, 5_000),
        2: (2_000, None),
    }
    assert nxt.batch == 5 and nxt.low_watermark == 1_200
    assert m.files == {0: "a.store", 1: "b.store"}  # unchanged


def test_a_batch_trusts_only_a_committed_manifest_before_it(tmp_path):
    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    for b in (3, 4, 5):
        files.write_manifest(Manifest(b, b * 100, {0: store_name(b, "t", 0, 0)}))
    # batch 5 ran and wrote its manifest, but Spark did not commit it: a replay of 5 reads 4
    assert files.manifest_before(5, {0, 1, 2, 3, 4}).batch == 4
    assert files.manifest_before(6, {0, 1, 2, 3, 4}).batch == 4
    assert files.manifest_before(6, {0, 1, 2, 3, 4, 5}).batch == 5
    assert files.manifest_before(3, {0, 1, 2}) == Manifest()


def test_collection_keeps_exactly_what_the_trusted_manifest_names(tmp_path):
    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    keep = Manifest(4, 0, {0: store_name(4, "t", 0, 0), 1: store_name(2, "t", 1, 0)})
    for interval, name in [
        (0, store_name(3, "t", 0, 0)),
        (0, keep.files[0]),
        (1, keep.files[1]),
        (0, store_name(5, "u", 0, 0)),
        (2, store_name(1, "t", 0, 0)),
    ]:
        files.write_store(interval, name, b"x")
    for b in (3, 4, 5):
        files.write_manifest(Manifest(b, 0, {}))
    files.write_manifest(keep)
    assert (
        files.collect(keep, 3) == 5
    )  # manifests 3 and 5; files of batches 3, 5 (a crashed run) and 1 (interval 2 keeps nothing)
    assert sorted(files.interval_dir(0).list()) == [keep.files[0]]
    assert files.interval_dir(1).list() == [keep.files[1]] and files.interval_dir(2).list() == []
    assert files.manifest_before(9, {4}) == keep
    assert files.read_store(1, keep.files[1]) == b"x"
    with pytest.raises(MillwheelError, match="missing"):
        files.read_store(0, store_name(3, "t", 0, 0))


def test_the_mapping_is_pinned_for_the_life_of_the_run_directory(tmp_path):
    root = Location.of(str(tmp_path / "run"))
    root.mkdirs()
    assert pin_mapping(root, "A", "arrow", False, 2) == {
        "mapping": "arrow",
        "partitions": 2,
        "partitioner": "pmod(murmur3_hash(group, seed 42), partitions)",
    }
    assert (
        pin_mapping(root, "A", "arrow", True, 8)["partitions"] == 2
    )  # the pinned count, not the session's
    assert pin_mapping(root, "B", "default", False, 2) == {"mapping": "default"}
    with pytest.raises(MillwheelError, match="started with mapping='arrow', not 'default'"):
        pin_mapping(root, "A", "default", True, 2)
    with pytest.raises(MillwheelError, match="started with mapping='default', not 'arrow'"):
        pin_mapping(root, "B", "arrow", True, 2)
    # a computation whose query started before mappings were pinned ran the default one
    with pytest.raises(MillwheelError, match="started with mapping='default'"):
        pin_mapping(root, "C", "arrow", True, 2)
    assert set(read_pin(root)["mappings"]) == {"A", "B"}


def test_of_a_batch_run_by_two_drivers_the_newest_epochs_manifest_is_read(tmp_path):
    """A fenced driver's late manifest of a batch never wins over its successor's: the outbox
    publishes the batch from the newest epoch's version, and the manifest read is that epoch's."""
    files = ColumnarFiles(Location.of(str(tmp_path / "c")))
    files.write_manifest(Manifest(4, 0, {0: "new.store"}, epoch=2))
    files.write_manifest(Manifest(4, 0, {0: "zombie.store"}, epoch=1))  # written last
    assert files.manifest_before(5, {4}).files == {0: "new.store"}
    assert files.collect(files.manifest_before(5, {4}), 1) == 1
    assert files.manifests.list() == ["000000000004-e2.json"]
