"""An offline rewrite of a computation on the Arrow mapping, in its own files (``_colfiles.py``).

The Arrow mapping keeps each key interval's columnar store in a file and, per committed
batch, a manifest naming them; batch ``B + 1`` reads the manifest of ``B`` of the newest
driver epoch (``ColumnarFiles.manifest_before``). So a rewrite made at committed batch
``B`` is one more manifest of ``B``, under the command's own epoch (above every driver's
before it), naming store files written for it — one atomic rename makes it the state the
next batch reads:

1. the old manifest of ``B`` and its store files are copied under
   ``colstate/<C>/.prewrite/`` (kept for ``--undo``: the next batch's collection deletes
   whatever its manifest does not name), unless a pending rewrite kept them already;
2. the rewritten stores are written as files no manifest names yet, and the new manifest
   is staged as ``colstate/<C>/.rewrite.json``;
3. ``run.json`` records the rewrite (``"step": "swapping"``), then the staged manifest is
   written into ``manifests/`` (``"pending"``). Killed in between, the next driver start or
   command writes it (``_rewrite_pin.settle_rewrite``).

``--undo`` (:func:`undo_arrow`) puts the old store files and manifest back (a batch may
have collected them and not committed), then deletes the manifests of ``B`` above the old
one: the old manifest is the newest of ``B`` again.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from millwheel._colstore import ColumnarStore
from millwheel._errors import MillwheelError
from millwheel.runtime._colfiles import STATE_DIR, ColumnarFiles, Manifest, store_name
from millwheel.runtime._fs import Location
from millwheel.runtime._outbox import crash_point
from millwheel.runtime._rewrite_apply import REWRITE_INPUT, apply_on_spark, refuse, settled
from millwheel.runtime._rewrite_pin import (
    ARROW_PRIOR,
    ARROW_STAGED,
    finish_arrow_swap,
    mark_step,
    pin_rewrite,
    restore_arrow,
    settle_rewrite,
    unpin_rewrite,
)
from millwheel.runtime._spark_internals import committed_batches

__all__ = ["rewrite_arrow", "undo_arrow"]


def _files(root: Location, computation: str) -> ColumnarFiles:
    return ColumnarFiles(root.child(STATE_DIR, computation))


def _keep_prior(files: ColumnarFiles, manifest: Manifest) -> None:
    """Copy ``manifest`` and the store files it names under ``.prewrite/`` (complete once
    its ``manifest.json`` is there: written last)."""
    prior = files.loc.child(ARROW_PRIOR)
    prior.delete()
    prior.mkdirs()
    for i, name in sorted(manifest.files.items()):
        d = prior.child(f"i{i}")
        d.mkdirs()
        data = files.read_store(i, name)
        with d.fs.open_output_stream(d.child(name).path) as s:
            s.write(data)
    prior.child("manifest.json").write_text(manifest.encode())


def rewrite_arrow(
    root: Location,
    computation: str,
    checkpoint: Location,
    task: Any,
    spark: Any,
    last: int,
    lease: Any,
    prior: dict[str, Any] | None,
    say: Any,
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring, for the command (``_state_rewrite.rewrite``), which
    holds the computation's lease and has settled its batches; ``task``: the rewrite's
    :class:`~millwheel.runtime._rewrite_apply.RewriteTask`."""
    files = _files(root, computation)
    committed = set(committed_batches(checkpoint))
    manifest = files.manifest_before(last + 1, committed)
    if manifest.batch != last:
        msg = f"cannot rewrite the state of {computation!r}: its last committed batch {last} has no manifest (the newest is of batch {manifest.batch}): the run directory is damaged"
        raise MillwheelError(msg)
    t_read = time.perf_counter()
    if prior is None or not files.loc.child(ARROW_PRIOR, "manifest.json").exists():
        _keep_prior(files, manifest)
    intervals = sorted(manifest.files)
    table = pa.table(
        {
            "group": pa.array(intervals, pa.int32()),
            "key": pa.nulls(len(intervals), pa.binary()),
            "value": pa.array(
                [files.read_store(i, manifest.files[i]) for i in intervals], pa.binary()
            ),
        },
        schema=REWRITE_INPUT,
    )
    read_s = time.perf_counter() - t_read
    crash_point(computation, "rewrite_read", last)
    task.columnar = True
    t_apply = time.perf_counter()
    result = apply_on_spark(spark, table, task)
    apply_s = time.perf_counter() - t_apply
    epoch = lease.epoch
    new = Manifest(last, manifest.low_watermark, {}, {}, epoch)
    kept = deleted = 0
    for i, blob, k, d in zip(
        result.column("group").to_pylist(),
        result.column("value").to_pylist(),
        result.column("kept").to_pylist(),
        result.column("deleted").to_pylist(),
        strict=True,
    ):
        kept, deleted = kept + int(k), deleted + int(d)
        if blob is None:
            continue
        name = store_name(last, f"rw{epoch}", 0, 0)
        files.write_store(int(i), name, blob)
        _, nlw, nwall, _ = ColumnarStore.decode(blob).summary()
        new.files[int(i)] = name
        new.timers[int(i)] = (nlw, nwall)
    files.loc.child(ARROW_STAGED).write_text(new.encode())
    crash_point(computation, "rewrite_staged", last)
    lease.check()
    entry = {
        "mapping": "arrow",
        "step": "swapping",
        "batch": last,
        "prior_epoch": int((prior or {}).get("prior_epoch", manifest.epoch)),
        "stacked": int((prior or {}).get("stacked", 0)) + 1,
        "function": task.name,
        "keys": kept,
        "deleted": deleted,
        "read": kept + deleted,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    pin_rewrite(root, computation, entry)
    crash_point(computation, "rewrite_pinned", last)
    finish_arrow_swap(files)
    mark_step(root, computation, "pending")
    return {
        "batch": last,
        "keys": kept,
        "deleted": deleted,
        "stacked": entry["stacked"],
        "read_s": read_s,
        "apply_s": apply_s,
        "build_s": 0.0,
    }


def undo_arrow(
    root: Location,
    computation: str,
    checkpoint: Location,
    entry: dict[str, Any],
    lease: Any,
    say: Any,
) -> None:
    """``--undo`` on the Arrow mapping: see the module docstring; refused once a batch after
    the rewrite has committed."""
    files = _files(root, computation)
    batch = int(entry["batch"])
    if entry.get("step") == "swapping":
        finish_arrow_swap(files)
    committed = committed_batches(checkpoint)
    if entry.get("step") != "undoing" and committed and committed[-1] > batch:
        settle_rewrite(root, computation, checkpoint, say)
        msg = f"the run committed batch {committed[-1]} after the rewrite (made at batch {batch}): it is part of the run now, and the old state is gone"
        raise refuse(computation, msg)
    if entry.get("step") != "undoing":
        settled(root, computation, checkpoint, lease, say)
        mark_step(root, computation, "undoing")
        crash_point(computation, "rewrite_undoing", batch)
    restore_arrow(files, batch)
    unpin_rewrite(root, computation)
