"""The state-store file operations of ``millwheel/runtime/_state_files.py``, without Spark:
which state-store files :func:`drop_uncommitted_state` deletes before a query starts."""

from __future__ import annotations

from millwheel.runtime._fs import Location
from millwheel.runtime._state_files import drop_uncommitted_state


def _tree(root: Location, files: list[str]) -> None:
    for path in files:
        loc = root.child(*path.split("/"))
        Location.of(loc.path.rsplit("/", 1)[0]).mkdirs()
        loc.write_text("x")


def test_only_the_versions_no_committed_batch_made_are_deleted(tmp_path):
    """Batches 0-2 committed, so versions up to 3 stay; 4 and 5 (a killed attempt's, its
    checksum, temp file, a maintenance snapshot, RocksDB's changelog and zip) go. Metadata,
    schema files (no dot) and RocksDB's SST files are not versions and stay."""
    ckpt = Location.of(str(tmp_path))
    keep = [
        "commits/0",
        "commits/1",
        "commits/2",
        "offsets/3",
        "state/0/0/1.delta",
        "state/0/0/3.delta",
        "state/0/0/.3.delta.crc",
        "state/0/0/3.snapshot",
        "state/0/1/3.changelog",
        "state/0/1/2.zip",
        "state/0/1/SSTs/000012-5f2a.sst",
        "state/0/_metadata/metadata",
        "state/0/_stateSchema/default/4_b599c411-906e",
    ]
    drop = [
        "state/0/0/4.delta",
        "state/0/0/.4.delta.crc",
        "state/0/0/.4.delta.0c1d-TID8.tmp",
        "state/0/0/4.snapshot",
        "state/0/1/4.changelog",
        "state/0/1/4_77e0.zip",
        "state/0/1/5.zip",
    ]
    _tree(ckpt, keep + drop)
    dropped = drop_uncommitted_state(ckpt)
    assert sorted(d.split("/state/", 1)[1] for d in dropped) == sorted(
        p.split("state/", 1)[1] for p in drop
    )
    assert all(ckpt.child(*p.split("/")).exists() for p in keep)
    assert drop_uncommitted_state(ckpt) == []  # nothing left to drop


def test_a_query_that_never_committed_keeps_no_version_above_zero(tmp_path):
    ckpt = Location.of(str(tmp_path))
    _tree(ckpt, ["offsets/0", "state/0/0/1.delta", "state/0/0/.1.delta.crc"])
    assert len(drop_uncommitted_state(ckpt)) == 2
    assert drop_uncommitted_state(Location.of(str(tmp_path / "nothing"))) == []
