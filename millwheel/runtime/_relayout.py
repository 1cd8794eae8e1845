"""``millwheel rescale --layout``: move a computation to the other state layout, exactly once.

A run directory pins its state layout at its first start (``run.json``): ``intervals``
(one ``GroupState`` row per key interval, ``applyInPandasWithState``) or ``keys`` (a row per
key, ``transformWithStateInPandas`` on RocksDB). The two are different stateful operators
with different state schemas and state-store providers, so Spark cannot resume one's
checkpoint with the other; and Spark's own way to seed a ``transformWithState`` query
(``initialState``) is for a *new* checkpoint — whose file sources would read every input
file again and whose batch numbers (which name the computation's outbox, output files
and audit lines) would start at 0. So the computation keeps its checkpoint — its offset
log, commit log and file-source logs, hence exactly the input it consumed — and only its
state store is replaced (docs/runtime.md, "Changing a computation's state layout"):

    millwheel rescale RUN --computation C --layout keys [--intervals N]

If a driver runs ``C``, the command asks it (``_online.py``): the driver stops only C's
query at a committed batch boundary and runs the same steps (:func:`plan`,
:func:`move_layout`) with its own Spark session and C's outbox and lease, then restarts
C's query with the new layout. Stopped, the command fences C itself (:func:`relayout`):

1. **Fence and settle**, as ``millwheel rescale`` does (``_rescale.py``): no driver runs;
   ``C``'s lease under a new driver epoch; every committed batch published; a batch
   planned and never committed dropped (with the state files it wrote).
2. **Read** every key's envelope at the last committed batch ``B`` (Spark's state data
   source, either layout).
3. **Build the new store** with the new layout's own operator: a one-batch query on a
   scratch checkpoint whose input is one row per key — for the Spark group of its interval
   in the new layout — and whose group functions (``_install.py``) install the envelopes
   with their timer index and event-time timer; nothing steps. Each group answers how many
   keys it installed: every key exactly once, or the command stops before anything changed.
4. **Graft**: the scratch query's committed version 1 is copied beside C's state as version
   ``B + 1`` (the version C's next batch loads: ``_state_files.graft_state``); then
   ``run.json`` gets C's new layout (``"state_layout"``, intervals, groups) with the step
   ``"relayout": "swapping"``, the old state directory is swapped for the new one, the
   offset-log entry of ``B`` gets the state-store settings the new store was written with
   (a restarted query plans with the provider and formats its last offset-log entry
   recorded), and ``run.json`` says
   ``"done"``.

Crash safety: before ``run.json`` changes nothing visible changed (the scratch checkpoint
and the staged store are hidden names, rebuilt by the next attempt). After it, a driver
start refuses (``ComputationQuery._check_migration``) and running the command again
finishes the swap, each step of which can be redone. The watermark authority retires C's
old intervals at the next start (``ComputationQuery._acquire``), so a zombie reporting for
one is fenced, as after an interval rescale.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._errors import EnvelopeError, MillwheelError
from millwheel.runtime._fs import Location
from millwheel.runtime._install import (
    INSTALL_INPUT,
    INSTALL_OUTPUT,
    IntervalInstaller,
    make_installer,
)
from millwheel.runtime._keying import interval_of
from millwheel.runtime._layout import computation_layouts, read_pin, update_pin
from millwheel.runtime._lease import DriverEpoch, Lease, driver_running
from millwheel.runtime._outbox import Outbox, crash_point
from millwheel.runtime._session import start_query
from millwheel.runtime._settings import STATE_LAYOUTS
from millwheel.runtime._settle import offline_outbox, refuse, refuse_own_files, settle
from millwheel.runtime._spark_internals import (
    committed_batches,
    offset_log_conf,
    read_envelopes,
    read_interval_states,
    set_offset_log_conf,
)
from millwheel.runtime._state_files import (
    graft_state,
    release_state_stores,
)
from millwheel.runtime._wire import STATE_SCHEMA, interval_groups
from millwheel.runtime.plans import STATE_STORE_CONF

__all__ = ["Change", "finish", "move_layout", "plan", "relayout", "relayout_wanted"]

#: the state-store settings a scratch query needs beyond its layout's: a RocksDB commit
#: writes a whole snapshot (``1.zip``), which loads alone once renamed (``graft_state``)
_SCRATCH_CONF = {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false"}


def relayout_wanted(run_dir: str, computation: str, layout: str | None) -> bool:
    """Does ``millwheel rescale`` of ``computation`` go through a layout change: ``--layout``
    given, a per-key computation re-intervaled (its store is rebuilt the same way), or a
    layout change of it to finish?"""
    if layout is not None:
        return True
    held = read_pin(Location.of(run_dir))
    entry = (held.get("computations") or {}).get(computation) or {}
    migration = entry.get("migration") or {}
    # a layout change not started since: its intervals at the authority are kept (see _move)
    if "relayout" in migration:
        return (
            migration["relayout"] != "done"
            or migration.get("authority") == "pending"
            or entry.get("state_layout") == "keys"
        )
    return str(entry.get("state_layout", held.get("state_layout", "intervals"))) == "keys"


@dataclass
class Change:
    """What a layout change moves: ``computation`` of the run in ``root`` from its layout
    ``old`` (``_layout.Layout``) to state layout ``layout`` with ``intervals`` key intervals;
    ``held`` is ``run.json`` as read. ``pending``: the migration of a change interrupted after
    ``run.json`` ("swapping"), which :func:`finish` completes instead of a new move."""

    root: Location
    computation: str
    layout: str
    intervals: int
    held: dict[str, Any]
    old: Any
    checkpoint: Location
    pending: dict[str, Any] | None = None


def relayout(
    run_dir: str,
    computation: str,
    layout: str | None,
    intervals: int | None = None,
    *,
    spark: Any = None,
    force: bool = False,
    log: Any = None,
) -> dict[str, Any]:
    """Move ``computation`` of the stopped run in ``run_dir`` to state layout ``layout``
    (``None``: keep its layout) and ``intervals`` key intervals (``None``: keep its count);
    see the module docstring. Returns what was done (keys moved, from and to, seconds...).
    A running driver changes it online instead (``_online.py``), through the same
    :func:`plan`, :func:`finish` and :func:`move_layout`."""
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    root = Location.of(run_dir)
    change = plan(root, computation, layout, intervals)
    if (running := driver_running(root, force)) is not None:
        raise refuse(running)
    with _fenced(root, computation) as lease:
        if change.pending is not None:
            return finish(change, say, t0)
        outbox = offline_outbox(root, computation, change.checkpoint, lease)
        return move_layout(change, outbox, spark, say, t0)


def plan(root: Location, computation: str, layout: str | None, intervals: int | None) -> Change:
    """Check that ``computation`` of the run in ``root`` can go to ``layout`` (``None``: its
    own) with ``intervals`` (``None``: its count) — a run directory, a known computation, a
    layout, no interval rescale whose state has not moved, something to change — and what
    it has now; raises :class:`MillwheelError` saying why not. Whether a driver runs is the
    caller's to check."""
    held = read_pin(root)
    if not held:
        msg = f"{root.uri} has no run.json: not a run directory, or never started"
        raise refuse(msg)
    checkpoint = root.child("checkpoints", computation)
    if not checkpoint.exists():
        known = (
            sorted(n for n in root.child("checkpoints").list() if not n.startswith("."))
            if root.child("checkpoints").exists()
            else []
        )
        msg = f"run directory {root.uri} has no computation {computation!r} (its computations: {known})"
        raise refuse(msg)
    if "groups" not in held or "intervals" not in held:
        msg = f"{root.child('run.json').uri} does not pin the run's key intervals and groups; start the run once with this millwheel first"
        raise refuse(msg)
    refuse_own_files(root, held, computation)  # the Arrow mapping's state is not in Spark's store
    old = computation_layouts(
        held, [computation], int(held["intervals"]), [int(g) for g in held["groups"]]
    )[computation]
    migration = old.migration or {}
    if layout is None:
        layout = old.state_layout
    if layout not in STATE_LAYOUTS:
        msg = f"--layout must be one of {', '.join(STATE_LAYOUTS)}, got {layout!r}"
        raise refuse(msg)
    if intervals is not None and (type(intervals) is not int or intervals < 1):
        msg = f"--intervals must be a positive integer, got {intervals!r}"
        raise refuse(msg)
    pending = migration.get("relayout")
    if pending is not None and pending != "done":
        if layout != old.state_layout or intervals not in (None, old.intervals):
            msg = (
                f"the change of {computation!r} to the {old.state_layout!r} layout with {old.intervals} key intervals was interrupted; "
                f"finish it first (--layout {old.state_layout} --intervals {old.intervals})"
            )
            raise refuse(msg)
        return Change(
            root, computation, layout, old.intervals, held, old, checkpoint, pending=migration
        )
    if migration and pending is None and not migration.get("moved"):
        msg = (
            f"the rescale of {computation!r} to {old.intervals} key intervals has not moved its state yet; "
            "resume the run until a batch has moved it (or finish the rescale), then change its layout"
        )
        raise refuse(msg)
    n = old.intervals if intervals is None else intervals
    if layout == old.state_layout and n == old.intervals:
        msg = f"computation {computation!r} keeps its state in the {layout!r} layout with {n} key intervals already: nothing to change"
        raise refuse(msg)
    return Change(root, computation, layout, n, held, old, checkpoint)


def finish(change: Change, say: Any, t0: float) -> dict[str, Any]:
    """Complete a change interrupted after ``run.json`` (``change.pending``): the swap, each
    step of which can be redone."""
    root, computation = change.root, change.computation
    _swap(root, computation, change.checkpoint, change.pending or {})
    root.child("checkpoints", f".{computation}.relayout").delete()
    say(f"finished the interrupted change of {computation!r} to the {change.layout!r} state layout")
    return {
        "computation": computation,
        "to_layout": change.layout,
        "to": change.intervals,
        "finished": True,
        "seconds": time.perf_counter() - t0,
    }


@contextmanager
def _fenced(root: Location, computation: str) -> Iterator[Lease]:
    """``computation``'s lease under a new driver epoch (a zombie driver of it is fenced from
    here on), the epoch marked stopped at the end."""
    leases = root.child("leases")
    epoch = DriverEpoch(leases)
    lease = Lease(
        leases.child(computation), f"computation {computation!r} (millwheel rescale --layout)"
    )
    lease.acquire(epoch.get())
    try:
        yield lease
    finally:
        epoch.mark(stopped=True)


def read_all(spark: Any, checkpoint: Location, layout: str, batch: int) -> dict[bytes, bytes]:
    """Every key's envelope at committed ``batch`` of a computation in ``layout``."""
    if batch < 0:
        return {}
    if layout == "keys":
        return read_envelopes(spark, checkpoint.uri, batch)
    try:
        what, states = read_interval_states(spark, checkpoint.uri, batch)
    except (EnvelopeError, ValueError) as exc:  # damaged, or not msgpack
        raise refuse(str(exc)) from None
    if what == "columnar":
        msg = f"the state in {checkpoint.uri} is a columnar computation's stores: a columnar computation keeps the interval-row layout (a store per key interval); millwheel rescale --intervals N re-intervals it"
        raise refuse(msg)
    out: dict[bytes, bytes] = {}
    for envs in states.values():
        out.update(envs)
    return out


def install_table(envs: dict[bytes, bytes], groups: list[int]) -> pa.Table:
    """The install query's input (:data:`~millwheel.runtime._install.INSTALL_INPUT`): each key
    for the group of its interval among ``groups``; one keyless row if there is no key (a
    batch must run for the store's first version to be written)."""
    n = len(groups)
    keys = list(envs)
    group = [groups[interval_of(kb, n)] for kb in keys]
    values: list[bytes | None] = [envs[kb] for kb in keys]
    if not keys:
        group, keys, values = [groups[0]], [None], [None]  # type: ignore[list-item]
    return pa.table(
        {
            "group": pa.array(group, pa.int32()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def build_store(
    spark: Any,
    scratch: Location,
    computation: str,
    layout: str,
    groups: list[int],
    table: pa.Table,
    partitions: int,
    *,
    installer: Any = None,
    conf: dict[str, str] | None = None,
) -> int:
    """Run the one-batch install query (``_install.py``) on the scratch checkpoint; returns
    the keys its groups installed. ``installer``: another group function for the interval-row
    layout (a rewrite's columnar stores, ``_rewrite_apply.StoreInstaller``); ``conf``: state-store
    settings to write the store with (a rewrite's: those the computation's checkpoint recorded)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    scratch.delete()
    inp = scratch.child("in")
    inp.mkdirs()
    pq.write_table(table, inp.child("rows.parquet").path, filesystem=inp.fs)
    rows = (
        spark.readStream.schema(INSTALL_INPUT)
        .parquet(inp.uri)
        .withColumn("wm_ts", F.lit(None).cast("timestamp"))
        .withWatermark("wm_ts", "0 seconds")
    )
    if layout == "keys":
        out = rows.groupBy("group").transformWithStateInPandas(
            statefulProcessor=make_installer(computation, groups),
            outputStructType=INSTALL_OUTPUT,
            outputMode="Append",
            timeMode="EventTime",
        )
    else:
        out = rows.groupBy("group").applyInPandasWithState(
            installer or IntervalInstaller(computation, groups),
            INSTALL_OUTPUT,
            STATE_SCHEMA,
            "append",
            # interval rows without Spark's timeout column, as a new query writes them
            # (``plans/intervals.py``): the computation's query reads the setting from them
            GroupStateTimeout.NoTimeout,
        )
    counts: list[int] = []
    writer = (
        out.writeStream.queryName(f"millwheel.{computation}.relayout")
        .foreachBatch(lambda df, _b: counts.extend(int(r[0]) for r in df.select("keys").collect()))
        .option("checkpointLocation", scratch.child("checkpoint").uri)
        .trigger(availableNow=True)
    )
    conf = {
        **STATE_STORE_CONF[layout],
        **(conf or {}),
        **_SCRATCH_CONF,
        "spark.sql.shuffle.partitions": str(partitions),
    }
    q = start_query(writer, spark, conf)
    q.awaitTermination()
    if q.exception() is not None:
        msg = f"the query that builds {computation!r}'s state in the {layout!r} layout failed: {q.exception()}"
        raise MillwheelError(msg)
    if committed_batches(scratch.child("checkpoint")) != [0]:
        msg = f"the query that builds {computation!r}'s state in the {layout!r} layout did not commit its one batch"
        raise MillwheelError(msg)
    # its providers' maintenance now, not after the graft copied the store (or into a later build's)
    release_state_stores(spark, scratch.child("checkpoint", "state"))
    return sum(counts)


def move_layout(change: Change, outbox: Outbox, spark: Any, say: Any, t0: float) -> dict[str, Any]:
    """Steps 1-4 of the module docstring after the fence, for a computation whose query is
    not running and whose lease ``outbox`` holds (the command's own, or the running driver's:
    ``_online.py``): publish what committed, drop a planned batch, read the state at the last
    committed batch, build the new store, graft it, ``run.json``, the swap. ``spark``: the
    session to read and build with (``None``: a local one)."""
    root, computation, held, old, checkpoint = (
        change.root,
        change.computation,
        change.held,
        change.old,
        change.checkpoint,
    )
    layout, intervals = change.layout, change.intervals
    last, dropped = settle(outbox, root, computation, checkpoint, say)
    if spark is None and last >= 0:
        from millwheel.runtime._session import command_session

        spark = command_session()  # quiet: its JVM's output goes to a file
    t_read = time.perf_counter()
    envs = read_all(spark, checkpoint, old.state_layout, last)
    read_s = time.perf_counter() - t_read
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
    if (
        partitions <= 0
    ):  # nothing committed: no partition count pinned yet (balance, not correctness)
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions")) if spark is not None else 1
    # the same groups for the same count (the new store starts empty); new ones for another count
    groups = (
        list(old.groups)
        if intervals == old.intervals
        else interval_groups(intervals, partitions, avoid=used)
    )
    scratch = root.child("checkpoints", f".{computation}.relayout")
    staging = checkpoint.child(".state.relayout")
    build_s = 0.0
    if last >= 0:
        t_build = time.perf_counter()
        installed = build_store(
            spark, scratch, computation, layout, groups, install_table(envs, groups), partitions
        )
        build_s = time.perf_counter() - t_build
        if installed != len(envs):
            msg = f"the new {layout!r} store of {computation!r} holds {installed} keys, not the {len(envs)} read; nothing was changed"
            raise MillwheelError(msg)
        crash_point(computation, "relayout_built", last)
        staging.delete()
        graft_state(
            scratch.child("checkpoint", "state"), staging, last + 1, final=checkpoint.child("state")
        )
        # the state-store settings the new store was written with (provider, format versions, encoding)
        store_conf = {
            k: v
            for k, v in offset_log_conf(scratch.child("checkpoint"), 0).items()
            if ".stateStore." in k and k not in _SCRATCH_CONF
        }
    else:
        store_conf = {}
    # the intervals the watermark authority holds: those of a change no start has made yet, if any
    prior = old.migration or {}
    held_intervals = (
        int(prior["from_intervals"]) if prior.get("authority") == "pending" else old.intervals
    )
    migration = {
        "relayout": "swapping",
        "from_layout": old.state_layout,
        "from_intervals": held_intervals,
        "authority": "pending",
        "batch": last,
        "conf": store_conf,
    }
    own = {
        "intervals": intervals,
        "groups": groups,
        "used_groups": sorted(used | set(groups)),
        "state_layout": layout,
        "migration": migration,
    }
    # under the pin's lock: online, the driver records other computations' steps meanwhile
    update_pin(root, lambda pin: pin.setdefault("computations", {}).__setitem__(computation, own))
    crash_point(computation, "relayout_pinned", last)
    _swap(root, computation, checkpoint, migration)
    scratch.delete()
    seconds = time.perf_counter() - t0
    say(
        f"computation {computation!r}: {len(envs)} keys moved from the {old.state_layout!r} layout ({old.intervals} intervals) to {layout!r} ({intervals})"
    )
    return {
        "computation": computation,
        "from_layout": old.state_layout,
        "to_layout": layout,
        "from": old.intervals,
        "to": intervals,
        "keys": len(envs),
        "batch": last,
        "dropped_planned": dropped,
        "groups": groups,
        "read_s": read_s,
        "build_s": build_s,
        "seconds": seconds,
    }


def _swap(
    root: Location, computation: str, checkpoint: Location, migration: dict[str, Any]
) -> None:
    """Put the staged store in place of the old one, give the last offset-log entry the new
    provider, and mark the change done in ``run.json``; every step can be redone after a kill."""
    state, staging, aside = (
        checkpoint.child("state"),
        checkpoint.child(".state.relayout"),
        checkpoint.child(".state.old"),
    )
    last = int(migration["batch"])
    layout = (read_pin(root).get("computations") or {})[computation]["state_layout"]
    if last < 0:
        state.delete()  # nothing committed: the new operator starts from nothing
    else:
        if staging.exists():
            if state.exists():
                aside.delete()
                state.move_to(aside)
            crash_point(computation, "relayout_swapping", last)
            staging.move_to(state)
        conf = dict(STATE_STORE_CONF[layout])
        conf = {**dict(migration.get("conf") or {}), **conf}
        set_offset_log_conf(checkpoint, last, conf)
        aside.delete()

    def done(pin: dict[str, Any]) -> None:
        m = pin["computations"][computation]["migration"]
        m["relayout"], m["moved"] = "done", True

    update_pin(root, done)
