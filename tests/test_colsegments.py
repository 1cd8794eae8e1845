"""Held-id segments in files beside the columnar store (``millwheel/_colsegments.py``): the
store names them instead of carrying them, reads them back, keeps a file it stopped naming
for ``keep_batches`` batches (the state store's history), then deletes it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from millwheel._coldedup import ColumnarDedup
from millwheel._colsegments import SegmentFiles
from millwheel._colstore import ColumnarStore


def _admit(d: ColumnarDedup, b: int, n: int = 50) -> list[str]:
    ids = [f"b{b}-{i}" for i in range(n)]
    assert d.admit(ids, [f"k{i % 7}".encode() for i in range(n)], np.full(n, b, np.int64)).all()
    return ids


def _files(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "ids").glob("*.ids")}


def test_a_store_names_its_segment_files_and_reads_them_back(tmp_path):
    d = ColumnarDedup()
    inline = ColumnarDedup()
    ids = []
    for b in range(3):
        ids += _admit(d, b)
        _admit(inline, b)
        wire = d.to_wire(SegmentFiles((tmp_path / "ids").as_uri(), b, keep_batches=10))
        assert all(
            isinstance(s[0], str) and s[0].startswith("file://") for s in wire[0]
        )  # names, not bytes
        d = ColumnarDedup.from_wire(wire)
    st = ColumnarStore(dedup=d)
    blob, fat = (
        st.encode(SegmentFiles((tmp_path / "ids").as_uri(), 3, keep_batches=10)),
        ColumnarStore(dedup=inline).encode(),
    )
    assert (
        blob is not None and fat is not None and len(blob) < len(fat) - 3 * 50 * 4
    )  # the ids are not in the row
    back = ColumnarStore.decode(blob).dedup
    keys = [f"k{i % 7}".encode() for i in range(50)]
    assert not back.admit(ids[:50], keys, np.zeros(50, np.int64)).any()  # all held
    assert back.admit([f"new{i}" for i in range(50)], keys, np.zeros(50, np.int64)).all()
    # the same bytes written again (a replayed batch) land in the same file
    before = _files(tmp_path)
    ColumnarDedup.from_wire(wire).to_wire(
        SegmentFiles((tmp_path / "ids").as_uri(), 2, keep_batches=10)
    )
    assert _files(tmp_path) == before


def test_a_file_no_store_names_is_deleted_only_after_keep_batches(tmp_path):
    """Four segments of one size tier merge into one file at the fourth batch: the three
    earlier files are no longer named, and go once ``keep_batches`` later batches ran."""
    d = ColumnarDedup()
    uri = (tmp_path / "ids").as_uri()
    for b in range(3):
        _admit(d, b)
        d.to_wire(SegmentFiles(uri, b, keep_batches=2))
    first_three = _files(tmp_path)
    assert len(first_three) == 3
    _admit(d, 3)
    wire = d.to_wire(SegmentFiles(uri, 3, keep_batches=2))
    assert len(wire[0]) == 1 and sorted(u.rsplit("/", 1)[1] for _, u in wire[9]) == sorted(
        first_three
    )
    for b in (4, 5):  # an older version of the store may still be recovered: its files stay
        d = ColumnarDedup.from_wire(d.to_wire(SegmentFiles(uri, b, keep_batches=2)))
        assert first_three <= _files(tmp_path)
    wire = d.to_wire(SegmentFiles(uri, 6, keep_batches=2))
    assert not first_three & _files(tmp_path) and wire[9] == [] and len(_files(tmp_path)) == 1


def test_a_store_whose_ids_are_all_collected_keeps_its_files_to_delete(tmp_path):
    uri = (tmp_path / "ids").as_uri()
    st = ColumnarStore()
    _admit(st.dedup, 0)
    st = ColumnarStore.decode(st.encode(SegmentFiles(uri, 0, keep_batches=1)))
    st.dedup.collect(horizon=100, gc_interval_ms=0)
    assert len(st.dedup) == 0
    blob = st.encode(SegmentFiles(uri, 1, keep_batches=1))
    assert blob is not None and len(_files(tmp_path)) == 1  # nothing held, one file still to delete
    st = ColumnarStore.decode(blob)
    assert st.encode(SegmentFiles(uri, 3, keep_batches=1)) is None and _files(tmp_path) == set()


def test_a_missing_segment_file_is_an_error_that_names_it(tmp_path):
    d = ColumnarDedup()
    _admit(d, 0)
    wire = d.to_wire(SegmentFiles((tmp_path / "ids").as_uri(), 0, keep_batches=5))
    for f in (tmp_path / "ids").glob("*.ids"):
        f.unlink()
    with pytest.raises(
        FileNotFoundError, match=r"names the id segment file file://.*\.ids, which is gone"
    ):
        ColumnarDedup.from_wire(wire)


def test_segment_files_are_plain_and_a_compressed_one_of_an_earlier_version_still_reads(tmp_path):
    """A segment kept in the store is zstd-compressed; one in a file is written plain (it no
    longer travels with the state row, and zstd cost far more than the bytes to write and
    read back). Files written compressed, before, read back the same."""
    uri = (tmp_path / "ids").as_uri()
    d, inline = ColumnarDedup(), ColumnarDedup()
    ids = _admit(d, 0, n=2_000)
    _admit(inline, 0, n=2_000)
    wire = d.to_wire(SegmentFiles(uri, 0, keep_batches=5))
    (path,) = (tmp_path / "ids").glob("*.ids")
    kept = inline.to_wire()[0][0][0]
    raw = sum(len(i) for i in ids)
    assert isinstance(kept, bytes) and len(kept) < raw < path.stat().st_size
    # an earlier version's file: the compressed bytes under a name of their own
    older = [[[SegmentFiles(uri, 0, keep_batches=5).put(kept), wire[0][0][1]]], *wire[1:]]
    assert older[0][0][0] != wire[0][0][0]
    keys = [f"k{i % 7}".encode() for i in range(2_000)]
    for w in (wire, older):
        back = ColumnarDedup.from_wire(w)
        assert not back.admit(ids, keys, np.zeros(2_000, np.int64)).any()  # all held
        assert back.admit(["fresh"], [b"k0"], np.zeros(1, np.int64)).all()


def test_temporary_files_of_writes_that_never_finished_are_swept_when_files_are_collected(tmp_path):
    """A worker killed between writing a segment and moving it leaves ``.<name>.tmp``; the
    next collection that deletes a file also deletes such files older than an hour, and
    leaves a fresh one (a write in progress) alone."""
    uri = (tmp_path / "ids").as_uri()
    d = ColumnarDedup()
    for b in range(3):
        _admit(d, b)
        d.to_wire(SegmentFiles(uri, b, keep_batches=1))
    stale, fresh = tmp_path / "ids" / ".abc.ids.1.x.tmp", tmp_path / "ids" / ".def.ids.2.y.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    hour_ago = time.time() - 3_700
    os.utime(stale, (hour_ago, hour_ago))
    _admit(d, 3)
    d.to_wire(SegmentFiles(uri, 3, keep_batches=1))  # merges the tier: three files no longer named
    assert stale.exists()  # nothing deleted yet: no sweep
    for b in (4, 5):
        d.to_wire(SegmentFiles(uri, b, keep_batches=1))
    assert not stale.exists() and fresh.exists()
    assert len(_files(tmp_path)) == 1
