"""Held-id segments in files beside the columnar store, not inside it (``_coldedup.py``).

A columnar store is one blob, the state row of its key interval, and everything in it
travels in every micro-batch: Spark's state store reads and writes the whole row, PySpark
pickles it both ways, and a worker that did not write it decodes it. The ids kept for
exactly-once (MillWheel §6.1.1) are most of it, and they only grow until the dedup
horizon passes them, so a batch's cost would follow the ids held, not the records it
touches. They are already kept in immutable segments (a batch's new ids one segment,
merged by size tier); with a :class:`SegmentFiles` each segment is written once, to a
file named by the hash of its bytes, and the store holds the file's URI instead of the
bytes.

* **Atomic with the batch.** A segment file is written (to a temporary name, then
  moved) before the step hands its state row to Spark, so a committed row names only
  files that exist. A batch that fails before it commits may leave files no row names;
  run again, it writes the same bytes under the same name, or other bytes under another.
  A worker killed mid-write leaves a temporary file: swept once it is an hour old
  (:meth:`SegmentFiles.sweep`, when a collection deletes files).
* **Collected behind the state store's history.** When a store stops naming a file (its
  segment merged into a larger one, or its ids collected), the file is remembered in the
  store with the batch that dropped it, and deleted once ``keep_batches`` later batches
  have run (Spark's ``spark.sql.streaming.minBatchesToRetain``: how far back its state
  store can still be rolled). An older version, which names it, can still be recovered
  until then.
* **Read back** by whoever decodes the store (a worker that did not write it, ``millwheel
  state``, a rescale's split): the URI says where; a file that is gone is an error that
  names it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow.fs as pafs
import xxhash

#: how old a segment's temporary file must be for :meth:`SegmentFiles.sweep` to take it for abandoned
STALE_TMP_S = 3600.0


class SegmentFiles:
    """Where one key interval's id segments go (a directory URI), the micro-batch writing
    them, and how many batches a file no store names is kept (see the module docstring)."""

    def __init__(self, directory: str, batch: int, keep_batches: int) -> None:
        self.directory = directory.rstrip("/")
        self.batch = batch
        self.keep_batches = keep_batches
        self._fs, self._path = pafs.FileSystem.from_uri(self.directory)

    def put(self, data: bytes) -> str:
        """The URI of a file holding ``data``, written unless it is there already."""
        name = f"{xxhash.xxh3_128_hexdigest(data)}.ids"
        path = f"{self._path}/{name}"
        if self._fs.get_file_info(path).type == pafs.FileType.NotFound:
            self._fs.create_dir(self._path, recursive=True)
            tmp = f"{self._path}/.{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"  # two writers never share one
            with self._fs.open_output_stream(tmp) as f:
                f.write(data)
            self._fs.move(tmp, path)
        return f"{self.directory}/{name}"

    def collect(self, retired: list[list[Any]], dropped: Iterable[str]) -> list[list[Any]]:
        """``retired`` (``[batch or None, uri]``: files no store names since that batch;
        ``None``: dropped where no batch was known) with ``dropped`` added as of this batch;
        the files dropped more than ``keep_batches`` batches ago deleted and left out."""
        out, deleted = [], False
        for b, uri in [*retired, *([None, u] for u in dropped)]:
            b = self.batch if b is None else b
            if self.batch - b > self.keep_batches:
                fs, path = pafs.FileSystem.from_uri(uri)
                if fs.get_file_info(path).type != pafs.FileType.NotFound:
                    fs.delete_file(path)
                    deleted = True
            else:
                out.append([b, uri])
        if deleted:
            self.sweep()
        return out

    def sweep(self, older_than_s: float = STALE_TMP_S) -> int:
        """Delete the temporary files of writes that never finished (a worker killed between
        writing and moving) older than ``older_than_s``: a live write takes milliseconds, and
        one whose file was swept fails its move, so its task fails and runs again. Run when
        :meth:`collect` deletes a file: rarely, and no more often than the files grow."""
        gone = 0
        now = time.time()
        for info in self._fs.get_file_info(pafs.FileSelector(self._path, allow_not_found=True)):
            if (
                info.base_name.startswith(".")
                and info.base_name.endswith(".tmp")
                and info.mtime is not None
                and now - info.mtime.timestamp() > older_than_s
            ):
                self._fs.delete_file(info.path)
                gone += 1
        return gone


def read_segment(uri: str) -> bytes:
    """The bytes of the segment file ``uri``."""
    fs, path = pafs.FileSystem.from_uri(uri)
    try:
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    except FileNotFoundError:
        msg = (
            f"a columnar store names the id segment file {uri}, which is gone: the checkpoint's "
            "ids directory was changed outside millwheel, or the store is older than the state store keeps"
        )
        raise FileNotFoundError(msg) from None
