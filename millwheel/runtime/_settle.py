"""Bring a stopped computation to its last committed batch, before its state moves (§7.1).

Both state moves — another number of key intervals (``_rescale.py``, offline or from a
running driver, ``_online.py``) and another state layout (``_relayout.py``) — read the
state at the last committed batch and change what the next batch starts from. Before that:

* every committed batch is **published** (``Outbox.recover``, as a driver start does):
  its per-interval summaries are of the old layout and must be applied before it goes;
* a batch **planned and never committed** (a driver stopped or killed mid-batch) is
  dropped from the offset log with the state files its tasks may have written
  (``_state_files.drop_planned_batch``), so the next start plans it anew after the
  move — refused if it published weak productions already (§6.1.3: a new plan could give
  their ids other contents).
"""

from __future__ import annotations

from typing import Any

from millwheel._errors import MillwheelError
from millwheel.runtime._audit import AuditLog
from millwheel.runtime._colfiles import STATE_DIR
from millwheel.runtime._fs import Location
from millwheel.runtime._lease import Lease
from millwheel.runtime._outbox import Outbox
from millwheel.runtime._spark_internals import (
    committed_batches,
    planned_batches,
)
from millwheel.runtime._state_files import drop_planned_batch
from millwheel.runtime._streams import DONE, FileStreamLog
from millwheel.runtime._wire import IntervalSummary


def refuse(msg: str) -> MillwheelError:
    """The error a rescale (of either kind) refuses with."""
    return MillwheelError(f"cannot rescale: {msg}")


def refuse_own_files(root: Location, held: dict[str, Any], computation: str) -> None:
    """Refuse a state move of a computation on the Arrow mapping (``run.json``'s
    ``"mappings"``, ``_colfiles.pin_mapping``): its state is in the mapping's own files
    (``colstate/``), keyed by the partition count pinned at its first start, which neither
    move reads or rewrites. Refused before anything changes: moving nothing would start the
    new layout from empty intervals, and the mapping's tasks would look for the old files."""
    entry = (held.get("mappings") or {}).get(computation) or {}
    if entry.get("mapping", "default") != "default":
        msg = (
            f"computation {computation!r} runs on the {entry['mapping']!r} mapping (run.json: {entry}); its state is in that mapping's "
            f"own files under {root.child(STATE_DIR, computation).uri}, which millwheel rescale does not move. "
            "Keep its key intervals, or run the computation on the default mapping in a new run directory"
        )
        raise refuse(msg)


class PlannedBatchPublished(MillwheelError):
    """The batch planned after the last committed one published weak productions already:
    the state cannot move before it (a new plan could give their ids other contents).
    Offline this refuses; a running driver lets the batch commit and tries again (``_online.py``)."""


def offline_outbox(root: Location, computation: str, checkpoint: Location, lease: Lease) -> Outbox:
    """The outbox of a stopped run's computation, publishing under ``lease`` and writing the
    audit line a driver writes when it publishes (``ComputationQuery._on_summary``)."""
    audit = AuditLog(root)

    def on_summary(batch: int, summaries: list[IntervalSummary]) -> None:
        if summaries:
            fired = sum(s.metrics.get("timers_fired", 0) for s in summaries)
            audit.batch(
                computation, batch, max(s.low_watermark for s in summaries), fired, lease.epoch
            )

    return Outbox(
        computation,
        root.child("outbox", computation),
        checkpoint,
        FileStreamLog(root),
        strong=True,
        on_summary=on_summary,
        tally=root.child("tallies", f"{computation}.json"),
        lease=lease,
    )


def settle(
    outbox: Outbox, root: Location, computation: str, checkpoint: Location, say: Any
) -> tuple[int, int | None]:
    """Publish every committed batch of ``computation`` (whose query is not running, and
    whose lease ``outbox`` holds) and drop a batch planned and never committed; returns
    ``(the last committed batch or -1, the dropped batch or None)``."""
    outbox.recover()
    committed = committed_batches(checkpoint)
    last = committed[-1] if committed else -1
    if outbox.published < last:
        msg = f"committed batch {last} of {computation!r} is not published (published up to {outbox.published}); resume the run first"
        raise refuse(msg)
    dropped = None
    for b in planned_batches(checkpoint):
        if b <= last:
            continue
        if b != last + 1:
            msg = f"the offset log of {computation!r} plans batch {b} after committed batch {last}: not a checkpoint Spark writes"
            raise refuse(msg)
        weak = weak_published(root, computation, b)
        if weak:
            msg = (
                f"cannot rescale: batch {b} of {computation!r} was planned, not committed, and published weak productions already ({weak[0]}, ...); "
                "a new plan of it could give their ids other contents: resume the run until it commits that batch, stop it, then rescale"
            )
            raise PlannedBatchPublished(msg)
        state_files = drop_planned_batch(checkpoint, b)
        dropped = b
        if state_files:
            say(
                f"dropped {len(state_files)} state-store files batch {b} of {computation!r} had written before it stopped"
            )
        say(
            f"dropped batch {b} of {computation!r}, planned and never committed: the next start plans it again after the state move"
        )
    return last, dropped


def weak_published(root: Location, computation: str, batch: int) -> list[str]:
    """Files a not-committed ``batch`` of ``computation`` published as weak productions (``Outbox.sink``)."""
    prefix = f"b{batch:010d}-w"
    out: list[str] = []
    streams = root.child("streams")
    for stream in streams.list() if streams.exists() else []:
        d = streams.child(stream, computation)
        for sub in (d, d.child(DONE)):
            out += [
                f"{stream}/{n}"
                for n in (sub.list() if sub.exists() else [])
                if n.startswith(prefix)
            ]
    return out
