"""``millwheel rescale``: give a stopped run's computation another number of key intervals, exactly once.

MillWheel's master splits and merges key intervals (§7.1). Here a run directory is bound
to its interval layout from its first start (``run.json``); this command gives one
computation ``C`` of a *stopped* run its own count ``N`` (``_layout.py``), so the next
driver on the run directory resumes with it. See docs/runtime.md, "Rescaling key intervals".

    millwheel rescale RUN --computation C --intervals N      # (``_online.rescale_main``: online if a driver runs C)

1. **No driver runs** (``_lease.live_drivers``), then the command takes ``C``'s lease
   under a new driver epoch: a zombie driver of ``C`` is fenced from here on.
2. **Every committed batch of C is published** (``Outbox.recover``, as a driver start
   does): their per-interval summaries are of the old layout and must be applied before
   it goes. A batch planned and never committed (a driver stopped or killed mid-batch) is
   dropped from the offset log, so the next start plans it anew, with the state move
   first (``_state_files.drop_planned_batch``); refused if it published weak
   productions already (a new plan could give their ids other contents).
3. **The state at the last committed batch** is read (Spark's state data source) per old
   group; every envelope becomes an :attr:`~millwheel.runtime._wire.RowKind.INSTALL` row
   for the new group its key hashes to (:func:`~millwheel.runtime._keying.interval_of`), and
   every old group gets a :attr:`~millwheel.runtime._wire.RowKind.RETIRE` row with the digest
   of what it holds. New groups are disjoint from every group C ever used, dealt
   round-robin over the checkpoint's shuffle partitions.
4. **One heartbeat file** carries those rows (``heartbeats/C/``, which C's query reads and
   groups by ``group``): written hidden, then ``run.json`` gets C's new layout and names the
   file, then the file is renamed into view. C's next micro-batch reads it whole, installs
   every envelope before any record or timer of the batch, and empties the old groups —
   or fails before committing, if an old group does not hold what was read. Spark commits
   the batch's state atomically, and a replay reads the same file: the move happens
   exactly once under kill -9.

Crash safety of the command itself: before ``run.json`` changes nothing visible changed
(a hidden file is ignored, and the next rescale replaces it); after it and before the
rename, the next driver start finishes the rename (``ComputationQuery._check_migration``:
``run.json`` names the file, so it was written whole), and so does running the command again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._colstore import ColumnarStore
from millwheel._errors import EnvelopeError
from millwheel.runtime._consumed import ConsumedFiles
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import interval_of
from millwheel.runtime._layout import HIDDEN_MOVE, computation_layouts, read_pin, update_pin
from millwheel.runtime._lease import DriverEpoch, Lease, driver_running
from millwheel.runtime._move import blob_digest, state_digest
from millwheel.runtime._outbox import Outbox, crash_point
from millwheel.runtime._query import HB_MOVE_SCHEMA
from millwheel.runtime._relayout import relayout, relayout_wanted
from millwheel.runtime._settle import offline_outbox, refuse, refuse_own_files, settle
from millwheel.runtime._spark_internals import (
    committed_batches,
    offset_log_conf,
    read_interval_states,
)
from millwheel.runtime._wire import RowKind, interval_groups

__all__ = ["Target", "move_rows", "move_state", "move_stores", "rescale", "settled", "target"]

#: the hidden name a rescale's heartbeat file has until ``run.json`` names it
_HIDDEN = HIDDEN_MOVE


@dataclass
class Target:
    """What a rescale moves: ``computation`` of the run in ``root``, from its layout ``old``
    (``_layout.Layout``) to ``intervals`` key intervals; ``held`` is ``run.json`` as read."""

    root: Location
    computation: str
    intervals: int
    held: dict[str, Any]
    old: Any
    checkpoint: Location
    heartbeats: Location


def rescale(
    run_dir: str,
    computation: str,
    intervals: int | None = None,
    *,
    layout: str | None = None,
    spark: Any = None,
    force: bool = False,
    log: Any = None,
) -> dict[str, Any]:
    """Give ``computation`` of the stopped run in ``run_dir`` ``intervals`` key intervals (see
    the module docstring); returns what was done (keys moved, from and to, seconds...).

    ``layout``: move it to that state layout too (``"intervals"`` or ``"keys"``: ``_relayout.py``,
    which also re-intervals a per-key computation). ``force``: skip the check that no driver
    runs (for a driver on another host that you know has stopped). ``spark``: a session to
    read the state with (default: a local one). A running driver is rescaled online instead:
    ``_online.py`` (``millwheel rescale`` sends it the request), through the same
    :func:`target`, :func:`settled` and :func:`move_state`.
    """
    refuse_own_files(Location.of(run_dir), read_pin(Location.of(run_dir)), computation)
    if relayout_wanted(run_dir, computation, layout):
        return relayout(run_dir, computation, layout, intervals, spark=spark, force=force, log=log)
    if intervals is None:
        msg = "give --intervals N, --layout intervals|keys, or both"
        raise refuse(msg)
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    root = Location.of(run_dir)
    tgt = target(root, computation, intervals)
    if (running := driver_running(root, force)) is not None:
        raise refuse(running)
    done = settled(tgt, say, t0)
    if done is not None:
        return done
    # 1. fence: a new driver epoch, C's lease under it
    leases = root.child("leases")
    epoch = DriverEpoch(leases)
    lease = Lease(leases.child(computation), f"computation {computation!r} (millwheel rescale)")
    lease.acquire(epoch.get())
    try:
        return move_state(
            tgt, offline_outbox(root, computation, tgt.checkpoint, lease), spark, say, t0
        )
    finally:
        epoch.mark(stopped=True)


def target(root: Location, computation: str, intervals: int | None) -> Target:
    """Check that ``computation`` of the run in ``root`` can be given ``intervals`` key
    intervals at all (a run directory, a known computation, the interval-row layout), and
    what it has now; raises :class:`MillwheelError` saying why not."""
    held = read_pin(root)
    if not held:
        msg = f"{root.uri} has no run.json: not a run directory, or never started"
        raise refuse(msg)
    if type(intervals) is not int or intervals < 1:
        msg = f"--intervals must be a positive integer, got {intervals!r}"
        raise refuse(msg)
    if held.get("state_layout", "intervals") != "intervals":
        msg = (
            f"run directory {root.uri} keeps its state in the per-key layout (state_layout={held['state_layout']!r}); "
            "millwheel rescale moves the interval-row layout only (docs/runtime.md, 'Rescaling key intervals')"
        )
        raise refuse(msg)
    checkpoint = root.child("checkpoints", computation)
    if not checkpoint.exists():
        known = (
            sorted(root.child("checkpoints").list()) if root.child("checkpoints").exists() else []
        )
        msg = f"run directory {root.uri} has no computation {computation!r} (its computations: {known})"
        raise refuse(msg)
    if "groups" not in held or "intervals" not in held:
        msg = f"{root.child('run.json').uri} does not pin the run's key intervals and groups; start the run once with this millwheel first"
        raise refuse(msg)
    refuse_own_files(root, held, computation)
    old = computation_layouts(
        held, [computation], int(held["intervals"]), [int(g) for g in held["groups"]]
    )[computation]
    return Target(
        root, computation, intervals, held, old, checkpoint, root.child("heartbeats", computation)
    )


def settled(tgt: Target, say: Any, t0: float) -> dict[str, Any] | None:
    """What to return without moving anything, or ``None`` if the state must move: a
    previous rescale of the computation whose file was never renamed into view is finished
    here; one whose move has not run (or not committed) yet answers ``pending`` to the same
    count and refuses another; the same count is a no-op."""
    computation, intervals, old, heartbeats = (
        tgt.computation,
        tgt.intervals,
        tgt.old,
        tgt.heartbeats,
    )
    heartbeats.mkdirs()
    consumed = ConsumedFiles(tgt.checkpoint)
    consumed.refresh()
    committed = committed_batches(tgt.checkpoint)
    last = committed[-1] if committed else -1
    if old.migration is not None and not old.migration.get("moved"):
        name = old.migration["file"]

        def pending(where: str) -> dict[str, Any]:
            # the same command again (an operator whose first one was killed after run.json):
            # it is written, and only the run's next micro-batch has to move it
            say(
                f"the rescale of {computation!r} to {intervals} key intervals is written; {where}: start the run"
            )
            return {
                "computation": computation,
                "to": intervals,
                "pending": True,
                "file": name,
                "seconds": time.perf_counter() - t0,
            }

        if heartbeats.child(name).exists():
            if intervals == old.intervals:
                return pending("the run moves its state in its next micro-batch")
            msg = (
                f"the rescale of {computation!r} to {old.intervals} key intervals has not run yet (its state move {name} waits "
                "in the heartbeats); resume the run, which moves the state in its first micro-batch, then rescale again"
            )
            raise refuse(msg)
        if name not in consumed.heartbeat_files:
            hidden = heartbeats.child(_HIDDEN.format(name))
            if not hidden.exists():
                msg = f"run.json names the state move {name} of {computation!r}, which is gone: the run directory is damaged"
                raise refuse(msg)
            if intervals != old.intervals:
                msg = f"the rescale of {computation!r} to {old.intervals} key intervals was interrupted; finish it first (--intervals {old.intervals})"
                raise refuse(msg)
            hidden.move_to(heartbeats.child(name))
            say(f"finished the interrupted rescale of {computation!r} to {intervals} key intervals")
            return {
                "computation": computation,
                "to": intervals,
                "finished": True,
                "file": name,
                "seconds": time.perf_counter() - t0,
            }
        if name not in consumed.heartbeat_names(last):
            if intervals == old.intervals:
                return pending("the batch that moves its state is planned, not committed")
            msg = (
                f"the batch that moves {computation!r}'s state into {old.intervals} key intervals is planned but not committed; "
                "resume the run until it commits, then rescale again"
            )
            raise refuse(msg)
    if intervals == old.intervals:
        say(f"computation {computation!r} has {intervals} key intervals already")
        return {
            "computation": computation,
            "from": old.intervals,
            "to": intervals,
            "keys": 0,
            "unchanged": True,
            "seconds": time.perf_counter() - t0,
        }
    return None


def move_state(tgt: Target, outbox: Outbox, spark: Any, say: Any, t0: float) -> dict[str, Any]:
    """Steps 2-4 of the module docstring, for a computation whose query is not running and
    whose lease ``outbox`` holds: publish what committed, drop a planned batch, read the
    state at the last committed batch, write the move's heartbeat file and ``run.json``."""
    root, computation, intervals, old, checkpoint, heartbeats = (
        tgt.root,
        tgt.computation,
        tgt.intervals,
        tgt.old,
        tgt.checkpoint,
        tgt.heartbeats,
    )
    # 2. publish what committed; drop a planned, uncommitted batch
    last, dropped = settle(outbox, root, computation, checkpoint, say)

    # 3. the state at the last committed batch, by old group
    if spark is None:
        from millwheel.runtime._session import command_session

        spark = command_session()
    t_read = time.perf_counter()
    try:
        what, states = (
            read_interval_states(spark, checkpoint.uri, last) if last >= 0 else ("envelopes", {})
        )
    except (EnvelopeError, ValueError) as exc:  # damaged, or not msgpack
        raise refuse(str(exc)) from None
    if what == "keys":
        msg = f"computation {computation!r} keeps its state in the per-key layout; millwheel rescale moves the interval-row layout only"
        raise refuse(msg)
    read_s = time.perf_counter() - t_read
    stray = sorted(set(states) - set(old.groups))
    if stray:
        msg = f"the state of {computation!r} has groups {stray} that its layout in run.json ({list(old.groups)}) does not: run.json was changed by hand, or the checkpoint is not the one this run.json describes"
        raise refuse(msg)
    interval_of_group = {g: i for i, g in enumerate(old.groups)}
    if (
        what == "columnar"
    ):  # a columnar computation's store per interval: split by key (``_colstore.py``)
        pieces = {g: ColumnarStore.decode(blob) for g, blob in states.items()}
        digests = {g: blob_digest(blob) for g, blob in states.items()}
        held_keys = {g: st.keys_held() for g, st in pieces.items()}
    else:
        pieces, digests = {}, {}
        held_keys = {g: set(envs) for g, envs in states.items()}
    for g, kbs in held_keys.items():
        wrong = [kb for kb in kbs if interval_of(kb, old.intervals) != interval_of_group[g]]
        if wrong:
            msg = f"{len(wrong)} keys of {computation!r} are held in key interval {interval_of_group[g]} of {old.intervals}, not their own: the state is damaged"
            raise refuse(msg)

    # the new groups: dealt over the checkpoint's partitions, disjoint from every group used before
    held = tgt.held
    entry = (held.get("computations") or {}).get(computation) or {}
    used = (
        {int(g) for g in entry.get("used_groups", [])}
        | set(old.groups)
        | {int(g) for g in held["groups"]}
    )
    partitions = (
        int(offset_log_conf(checkpoint, last).get("spark.sql.shuffle.partitions", 0))
        if last >= 0
        else 0
    )
    if partitions <= 0:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    groups = interval_groups(intervals, partitions, avoid=used)

    # 4. the heartbeat file: installs for the new groups, retirements for the old ones
    if what == "columnar":
        table, keys = move_stores(pieces, digests, old.groups, groups)
    else:
        table, keys = move_rows(states, old.groups, groups)
    nums = [
        int(n.split(".")[0]) for n in heartbeats.list() if n.endswith(".parquet") and n[0].isdigit()
    ]
    listed = ConsumedFiles(
        checkpoint
    )  # names the file source has seen are never read again: a new number
    listed.refresh()
    nums += [int(n.split(".")[0]) for n in listed.heartbeat_files if n[:1].isdigit()]
    name = f"{max(nums, default=-1) + 1:012d}.parquet"
    hidden = heartbeats.child(_HIDDEN.format(name))
    pq.write_table(table, hidden.path, filesystem=hidden.fs)
    migration = {
        "file": name,
        "from_intervals": old.intervals,
        "authority": "pending",
        "batch": last,
    }
    own = {
        "intervals": intervals,
        "groups": groups,
        "used_groups": sorted(used | set(groups)),
        "migration": migration,
    }
    update_pin(root, lambda pin: pin.setdefault("computations", {}).__setitem__(computation, own))
    crash_point(computation, "rescale_pinned", intervals)  # test hook: ``C:rescale_pinned:N``
    hidden.move_to(heartbeats.child(name))
    seconds = time.perf_counter() - t0
    say(
        f"computation {computation!r}: {keys} keys move from {old.intervals} to {intervals} key intervals in its next micro-batch ({name})"
    )
    return {
        "computation": computation,
        "from": old.intervals,
        "to": intervals,
        "keys": keys,
        "batch": last,
        "published_upto": outbox.published,
        "dropped_planned": dropped,
        "file": name,
        "groups": groups,
        "read_s": read_s,
        "seconds": seconds,
    }


class _MoveRows:
    """The rows of a state move's heartbeat file (:data:`~millwheel.runtime._query.HB_MOVE_SCHEMA`), added one by one."""

    def __init__(self) -> None:
        self.interval: list[int] = []
        self.group: list[int] = []
        self.kind: list[int] = []
        self.key: list[bytes | None] = []
        self.value: list[bytes] = []

    def _add(
        self, interval: int, group: int, kind: RowKind, key: bytes | None, value: bytes
    ) -> None:
        self.interval.append(interval)
        self.group.append(group)
        self.kind.append(int(kind))
        self.key.append(key)
        self.value.append(value)

    def install(self, interval: int, group: int, key: bytes | None, value: bytes) -> None:
        self._add(interval, group, RowKind.INSTALL, key, value)

    def retire(self, group: int, digest: list[int]) -> None:
        self._add(-2, group, RowKind.RETIRE, None, msgpack.packb(digest))

    def table(self) -> pa.Table:
        rows = len(self.kind)
        return pa.table(
            {
                "interval": pa.array(self.interval, pa.int32()),
                "wm": pa.nulls(rows, pa.int64()),
                "now": pa.nulls(rows, pa.int64()),
                "kind": pa.array(self.kind, pa.int32()),
                "group": pa.array(self.group, pa.int32()),
                "key": pa.array(self.key, pa.binary()),
                "value": pa.array(self.value, pa.binary()),
            },
            schema=HB_MOVE_SCHEMA,
        )


def move_rows(
    states: dict[int, dict[bytes, bytes]], old_groups: Any, new_groups: list[int]
) -> tuple[pa.Table, int]:
    """The rows of a state move (:data:`~millwheel.runtime._query.HB_MOVE_SCHEMA`): one
    :attr:`RowKind.INSTALL` per key, to the new group its key hashes to, and one
    :attr:`RowKind.RETIRE` per old group with the digest of what it holds; and how many keys."""
    n = len(new_groups)
    rows = _MoveRows()
    keys = 0
    for g in old_groups:
        envs = states.get(g, {})
        for kb, env in envs.items():
            i = interval_of(kb, n)
            rows.install(i, new_groups[i], kb, env)
            keys += 1
        rows.retire(g, state_digest(envs))
    return rows.table(), keys


def move_stores(
    stores: dict[int, Any], digests: dict[int, list[int]], old_groups: Any, new_groups: list[int]
) -> tuple[pa.Table, int]:
    """The rows of a columnar computation's state move: each old group's store
    (:class:`~millwheel._colstore.ColumnarStore`, decoded) split by the new interval of its
    keys, one :attr:`RowKind.INSTALL` row per piece (key ``None``, the piece's blob: the new
    group merges its pieces), and one :attr:`RowKind.RETIRE` row per old group with the
    :func:`~millwheel.runtime._move.blob_digest` of its store as read; and how many keys."""
    n = len(new_groups)
    rows = _MoveRows()
    keys = 0
    for g in old_groups:
        store = stores.get(g)
        if store is not None:
            keys += len(store.keys_held())
            for i, piece in sorted(store.split(lambda kb: interval_of(kb, n)).items()):
                blob = piece.encode()
                if blob is not None:  # a piece that holds nothing is not stored
                    rows.install(i, new_groups[i], None, blob)
        rows.retire(g, digests.get(g, blob_digest(None)))
    return rows.table(), keys
