"""A streaming query's state-store files, and the providers in this JVM that write them:
the Spark internals a move, a restart's cleanup and a layout change's graft depend on
(``_spark_internals.py`` has the rest; their contract tests are in
``tests/runtime/test_spark_internals.py`` and ``test_state_files.py``).

* **the state files' names** — ``state/<operator>/<partition>/<version>.delta`` and
  ``.snapshot`` (the HDFS-backed provider), ``<version>.changelog`` and ``<version>.zip``
  with ``SSTs/`` beside them (RocksDB): :func:`drop_planned_batch`,
  :func:`drop_uncommitted_state`, :func:`graft_state`.
* **the state stores a JVM keeps loaded** — :func:`release_state_stores` reads the private
  ``loadedProviders``, ``unloadedProvidersToClose``, ``snapshotPartitions`` and
  ``cleanupPartitions`` of Spark's ``StateStore`` object by reflection and calls its
  ``doMaintenanceAndUnload`` and ``closeProvider``.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from millwheel._errors import RunError
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import OFFSETS, STATE, committed_batches

__all__ = ["drop_planned_batch", "drop_uncommitted_state", "graft_state", "release_state_stores"]


def drop_planned_batch(checkpoint: Location, batch: int) -> list[str]:
    """Forget batch ``batch``, planned and never committed: its offset-log entry (with the
    checksum file beside it) and every state-store file of the version it would have
    committed (``state/<operator>/<partition>/<batch + 1>.delta`` and the like); returns the
    state files deleted. The query's next start plans the batch anew from the last
    committed one, over the file sources' logs (which keep every file they listed, so the
    new plan reads them all). Only ``_rescale.py`` does this, under its checks.

    The state files matter: a task of the dropped attempt may have finished and written
    its partition's next version; Spark expects a re-run of a batch to be the *same* batch,
    and when it finds that file already there it keeps it (the checkpoint file managers
    rename without overwriting). A batch planned anew is not the same batch, so a kept
    file would be another batch's state.
    """
    # the state files first: killed in between, the offset-log entry is still there and the
    # next start replays the *same* batch, which writes them again; the other way round, it
    # would plan a new batch and keep the files of the dropped one
    dropped = _drop_state_version(checkpoint.child(STATE), batch + 1)
    offsets = checkpoint.child(OFFSETS)
    for name in (str(batch), f".{batch}.crc"):
        offsets.child(name).delete()
    return dropped


_STATE_FILE_KINDS = (".delta", ".snapshot", ".changelog", ".zip")


def drop_uncommitted_state(checkpoint: Location) -> list[str]:
    """Delete every state-store file of a version no committed batch made (above the last
    committed batch + 1); returns the files deleted. Every computation query calls it before
    it starts (``_query.py``), so a replayed batch is the only writer of its version.

    Without it, a killed attempt's state outlives its replay. A task commits its
    state-store version at its end, before Spark's commit log. Spark takes a replay to be
    the *same* batch: when the version's file is already there it keeps it rather than
    rename its own over it (the checkpoint file managers rename without overwriting), and
    the store's maintenance thread may have snapshotted it too (the HDFS-backed provider
    snapshots the newest version it holds; RocksDB uploads ``<version>.zip``). For a
    computation that draws random numbers or reads the clock, the replay is another batch:
    every later load of that version — a restart, ``millwheel state`` — would give the
    killed attempt's state, not the one committed with the published productions
    (MillWheel §6.1.2). Spark's own answer, checkpoint ids per attempt
    (``checkpointFormatVersion`` 2), is for the RocksDB provider only.
    ``tests/runtime/test_strong_productions.py`` has the kill that shows it.
    """
    last = max(committed_batches(checkpoint), default=-1)
    return _drop_state_versions(checkpoint.child(STATE), lambda v: v > last + 1)


def _drop_state_version(loc: Location, version: int) -> list[str]:
    """Delete the state-store files of ``version`` under ``loc`` (every operator, partition
    and store; their checksums and temporary files too)."""
    return _drop_state_versions(loc, lambda v: v == version)


def _state_file_version(name: str) -> int | None:
    """The version a state-store file is of (``12.delta``, ``.12.delta.crc``, ``12_<id>.zip``,
    ``12.changelog``...), or ``None`` for any other file."""
    bare = name.lstrip(".")
    head = bare.split(".", 1)[0].split("_", 1)[0]
    return int(head) if head.isdigit() and any(k in bare for k in _STATE_FILE_KINDS) else None


def _drop_state_versions(loc: Location, drop: Callable[[int], bool]) -> list[str]:
    dropped: list[str] = []
    if not loc.exists():
        return dropped
    for name in loc.list():
        if name == "_metadata":
            continue
        child = loc.child(name)
        version = _state_file_version(name)
        if version is not None:
            if drop(version):
                child.delete()
                dropped.append(child.uri)
        elif (
            not name.startswith(".")
            and "." not in name
            and loc.fs.get_file_info(child.path).type == pafs.FileType.Directory
        ):
            # an operator, partition or store directory (not a file without a dot in its name,
            # as transformWithState's schema files ``_stateSchema/default/<batch>_<uuid>`` are)
            dropped += _drop_state_versions(child, drop)
    return dropped


_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.StateStore$"


def release_state_stores(spark: Any, state: Location, timeout_s: float = 60.0) -> int:
    """Run the pending maintenance of, and close, every state-store provider this JVM still
    holds for a store under ``state`` (a stopped query's ``<checkpoint>/state``, every run
    of it); returns how many. Call it once the query stopped and its jobs are gone
    (``_session.wait_for_jobs``), *before* changing the store's files.

    A stopped query's providers stay loaded. Spark runs their maintenance later — at its
    next round, or at once when a new run's provider of the same store reports active —
    and only then closes them: a RocksDB provider uploads its queued snapshot
    ``<version>.zip``, an HDFS-backed one writes ``<version>.snapshot``, by path. A store
    changed in between (a layout change's swap puts a new store at that path; a restart
    drops a killed attempt's version) then gets an old store's file: a snapshot that
    replaces the new store's base or a dropped attempt's version, and a later load reads
    the old keys and timers (a CI fault campaign saw windows fired twice after an online
    ``keys -> keys`` rescale). Run here, that maintenance writes before the change, which
    then drops or moves aside what it wrote.

    Providers live in the JVM that ran the tasks: the driver's own in local mode. With
    executors elsewhere (``spark://``) this finds none (``docs/runtime.md``, "Known limits").
    """
    if spark is None:
        return 0
    jvm = spark.sparkContext._jvm
    cls = jvm.java.lang.Class.forName(_STATE_STORE)
    store = cls.getField("MODULE$").get(None)

    def private(name: str) -> Any:
        field = cls.getDeclaredField(name)
        field.setAccessible(True)
        return field.get(store)

    want = state.path.rstrip("/")

    def ours(provider_id: Any) -> bool:
        root = str(provider_id.storeId().checkpointRootLocation())
        path = urllib.parse.urlparse(root).path if ":" in root else root
        return path.rstrip("/") == want

    loaded, queue = private("loadedProviders"), private("unloadedProvidersToClose")
    busy = (private("snapshotPartitions"), private("cleanupPartitions"))
    keys = jvm.java.util.ArrayList(
        jvm.scala.jdk.javaapi.CollectionConverters.asJava(loaded.keySet())
    )
    ids = [i for i in keys if ours(i)]
    queued = [e for e in list(queue.toArray()) if ours(e._1())]
    everyone = ids + [e._1() for e in queued]
    deadline = time.monotonic() + timeout_s

    def settle() -> None:
        """Until the pool's maintenance of none of them is under way."""
        while any(b.contains(i) for b in busy for i in everyone) and time.monotonic() < deadline:
            time.sleep(0.05)

    settle()  # the pool's maintenance of one of them: let it finish first
    # a provider whose maintenance fails (a killed attempt's) is unloaded all the same: it
    # leaves ``loadedProviders`` (or the queue) first, and nothing runs its maintenance again
    for provider_id in ids:
        with contextlib.suppress(Exception):
            store.doMaintenanceAndUnload(provider_id)
    for entry in queued:
        if queue.remove(entry):  # else the pool took it meanwhile: waited for below
            with contextlib.suppress(Exception):
                entry._2().doMaintenance()
            with contextlib.suppress(Exception):
                store.closeProvider(entry._1(), entry._2())
    settle()
    return len(everyone)


def graft_state(
    scratch: Location, staging: Location, version: int, final: Location | None = None
) -> int:
    """Copy the state a scratch query committed as its version 1 (the ``state/`` directory of
    its checkpoint, ``scratch``) into ``staging`` as version ``version``; returns the files copied.

    A store's version is only in its files' names: the RocksDB provider's snapshot
    ``1.zip`` (with changelog checkpointing off, each commit writes one; it names the SST
    files beside it, copied as they are) becomes ``<version>.zip``, and the HDFS-backed
    provider's first delta ``1.delta`` — every entry of it a put, the format of a snapshot —
    becomes ``<version>.snapshot``. Either loads alone, without the versions before it.
    The operator's metadata (``_metadata/``: ``transformWithState``'s names its state
    schema files by their full path) is copied with ``scratch``'s path replaced by
    ``final``'s, where the store will live (and without its checksum file). Other files are
    copied as they are; checksum files of renamed files are left out. Only ``_relayout.py``
    does this (docs/runtime.md, "Changing a computation's state layout").
    """
    return _graft(
        scratch, staging, version, (scratch.path, (final or staging).path), in_metadata=False
    )


def _graft(
    scratch: Location, staging: Location, version: int, paths: tuple[str, str], in_metadata: bool
) -> int:
    staging.mkdirs()
    copied = 0
    for name in scratch.list():
        src, dst = scratch.child(name), staging.child(name)
        bare = name.lstrip(".")
        if scratch.fs.get_file_info(src.path).type == pafs.FileType.Directory:
            copied += _graft(src, dst, version, paths, in_metadata or name == "_metadata")
            continue
        if (bare.startswith("1.") or in_metadata) and bare.endswith(".crc"):
            continue  # the checksum of a file renamed or rewritten below: a stale one would fail the read
        if in_metadata:
            with scratch.fs.open_input_stream(src.path) as f:
                text = f.read()
            with staging.fs.open_output_stream(dst.path) as f:
                f.write(text.replace(paths[0].encode(), paths[1].encode()))
            copied += 1
            continue
        if name == "1.zip":
            dst = staging.child(f"{version}.zip")
        elif name == "1.delta":
            dst = staging.child(f"{version}.snapshot")
        elif name.startswith("1.") and any(name.endswith(k) for k in _STATE_FILE_KINDS):
            msg = f"state file {src.uri} of the scratch query is of no kind a graft knows (1.zip, 1.delta)"
            raise RunError(msg)
        scratch.fs.copy_file(src.path, dst.path)
        copied += 1
    return copied
