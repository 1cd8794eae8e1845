"""Bootstrapping a computation's state: ``millwheel state load RUN C SOURCE``, and the same load
at a driver's start when the topology gives ``C`` an ``initial_state`` (docs/runtime.md,
"Bootstrapping state"; docs/concepts.md, "Bootstrap").

The state goes in through the path a rescale's state move takes (``_rescale.py``): one
heartbeat file of :attr:`~millwheel.runtime._wire.RowKind.INSTALL` rows (``_state_write.py``:
each key's envelope through ``C``'s own codec, or each key interval's columnar store), which
``C``'s first micro-batch installs before any record, atomically with Spark's commit of
that batch (``_move.py``; key rows, ``plans/keys.py``; the Arrow mapping's store files,
``plans/arrow.py``). Steps, under ``C``'s lease (a new driver epoch for the command, the
driver's own at a start):

1. **Refusals.** A load ``run.json`` pins already (``"bootstraps": {C: {...}}``) with the
   same digest (``_state_write.Installs.digest``) is a no-op that says so; with another, a
   refusal. ``C`` has committed a batch: refused (its state is its own now). A driver runs
   the run directory (``_lease.live_drivers``): refused (the command only).
2. **The first batch is still to plan.** A batch planned and not committed (a start killed
   mid-batch) is dropped from the offset log, so the next start plans it with the load in
   it (``_settle.settle``; refused if it published weak productions already).
3. **The file, then the pin, then the rename.** The rows are written to a hidden file in
   ``heartbeats/C/``; ``run.json`` then names it, with its digest and key count; then it is
   renamed into view. A kill -9 before the pin leaves a hidden file that nothing reads (the
   next load writes another); after it, a start or the same load finishes the rename
   (``run.json`` names it, so it was written whole). Spark's first batch of ``C`` reads the
   file whole or the batch does not commit; its replay reads the same file.

A bootstrap is exactly once: none of it before its batch commits, all of it after.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import pyarrow.parquet as pq

from millwheel._errors import MillwheelError
from millwheel._initial_state import InitialState
from millwheel._topology import ComputationSpec
from millwheel.runtime._consumed import ConsumedFiles
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import computation_layouts, read_pin, update_pin
from millwheel.runtime._lease import DriverEpoch, Lease, driver_running
from millwheel.runtime._outbox import Outbox, crash_point
from millwheel.runtime._settle import offline_outbox, settle
from millwheel.runtime._spark_internals import committed_batches
from millwheel.runtime._state_write import Installs, install_rows

__all__ = ["BOOTSTRAPS", "bootstrap_at_start", "load", "load_main", "pinned"]

#: ``run.json``'s key for the loads it pins: ``{C: {"file", "digest", "keys", "source"}}``
BOOTSTRAPS = "bootstraps"
#: the hidden name a load's heartbeat file has until ``run.json`` names it
_HIDDEN = ".{}.bootstrap"


def refuse(msg: str) -> MillwheelError:
    return MillwheelError(f"cannot load the state: {msg}")


def pinned(held: dict[str, Any], computation: str) -> dict[str, Any] | None:
    """The load ``run.json`` (``held``) pins for ``computation``, if any."""
    return (held.get(BOOTSTRAPS) or {}).get(computation)


def _finish(heartbeats: Location, name: str) -> bool:
    """Rename a pinned load's file into view if it is still hidden; whether it did."""
    hidden = heartbeats.child(_HIDDEN.format(name))
    if heartbeats.child(name).exists() or not hidden.exists():
        return False
    hidden.move_to(heartbeats.child(name))
    return True


def _check_pinned(
    entry: dict[str, Any], computation: str, heartbeats: Location, committed: list[int], say: Any
) -> str:
    """A pinned load is done (a batch committed after it), waiting for the first batch (its
    file in view: renamed here if a kill stopped the load just before), or damaged."""
    if committed:
        return "installed"
    name = entry["file"]
    if _finish(heartbeats, name):
        say(f"computation {computation!r}: finished the state load a kill had interrupted ({name})")
    if heartbeats.child(name).exists():
        return "waiting"
    msg = (
        f"run.json pins a state load of {computation!r} ({heartbeats.child(name).uri}) that is gone before "
        "any batch of the computation committed: the run directory is damaged"
    )
    raise refuse(msg)


def _next_name(heartbeats: Location, checkpoint: Location) -> str:
    """A heartbeat file number no file of the computation had (a file source never reads a
    name it has listed before)."""
    nums = [
        int(n.split(".")[0]) for n in heartbeats.list() if n.endswith(".parquet") and n[0].isdigit()
    ]
    listed = ConsumedFiles(checkpoint)
    listed.refresh()
    nums += [int(n.split(".")[0]) for n in listed.heartbeat_files if n[:1].isdigit()]
    return f"{max(nums, default=-1) + 1:012d}.parquet"


def _write(
    root: Location,
    spec: ComputationSpec,
    source: InitialState,
    outbox: Outbox,
    say: Any,
    t0: float,
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring, ``outbox``'s lease held."""
    computation = spec.name
    held = read_pin(root)
    if "groups" not in held or "intervals" not in held:
        msg = (
            f"{root.child('run.json').uri} does not pin the run's key intervals yet (the run never started); "
            f"give the topology's computation initial_state=... instead: `millwheel run` loads it before {computation!r}'s first batch"
        )
        raise refuse(msg)
    layout = computation_layouts(
        held, [computation], int(held["intervals"]), [int(g) for g in held["groups"]]
    )[computation]
    checkpoint = root.child("checkpoints", computation)
    heartbeats = root.child("heartbeats", computation)
    heartbeats.mkdirs()
    committed = committed_batches(checkpoint)
    t_read = time.perf_counter()
    installs = install_rows(spec, source, layout.intervals, list(layout.groups))
    read_s = time.perf_counter() - t_read
    done = _settled(held, computation, installs, heartbeats, committed, say)
    if done is not None:
        return {**done, "seconds": time.perf_counter() - t0}
    if committed:
        msg = (
            f"computation {computation!r} has committed {len(committed)} batches (the last {committed[-1]}): "
            "its state is its own now; load into a run directory where it has not run yet"
        )
        raise refuse(msg)
    try:
        last, dropped = settle(outbox, root, computation, checkpoint, say)
    except MillwheelError as exc:
        raise refuse(str(exc).removeprefix("cannot rescale: ")) from None
    name = _next_name(heartbeats, checkpoint)
    hidden = heartbeats.child(_HIDDEN.format(name))
    pq.write_table(installs.table, hidden.path, filesystem=hidden.fs)
    crash_point(computation, "bootstrap_written", 0)  # test hook: ``C:bootstrap_written:0``
    entry = {
        "file": name,
        "digest": installs.digest,
        "keys": installs.keys,
        "rows": installs.table.num_rows,
        "source": source.describe(),
    }
    update_pin(root, lambda pin: pin.setdefault(BOOTSTRAPS, {}).__setitem__(computation, entry))
    crash_point(computation, "bootstrap_pinned", 0)  # test hook: ``C:bootstrap_pinned:0``
    hidden.move_to(heartbeats.child(name))
    say(
        f"computation {computation!r}: {installs.keys:,} keys of initial state ({source.describe()}) "
        f"are installed by its first batch ({name})"
    )
    return {
        "computation": computation,
        "keys": installs.keys,
        "digest": installs.digest,
        "file": name,
        "dropped_planned": dropped,
        "read_s": read_s,
        "seconds": time.perf_counter() - t0,
    }


def _settled(
    held: dict[str, Any],
    computation: str,
    installs: Installs,
    heartbeats: Location,
    committed: list[int],
    say: Any,
) -> dict[str, Any] | None:
    """What a load returns when ``run.json`` pins one already: the same (a no-op), or a refusal."""
    entry = pinned(held, computation)
    if entry is None:
        return None
    if entry["digest"] != installs.digest:
        msg = (
            f"computation {computation!r} was loaded with another initial state already ({entry['keys']:,} keys "
            f"from {entry.get('source')}, digest {entry['digest']}; this one: {installs.keys:,} keys, digest "
            f"{installs.digest}); a computation is bootstrapped once: start a new run directory for another"
        )
        raise refuse(msg)
    where = _check_pinned(entry, computation, heartbeats, committed, say)
    say(
        f"computation {computation!r}: this initial state ({entry['keys']:,} keys) is loaded already"
        + (" and installed" if where == "installed" else "; its first batch installs it")
        + ": nothing to do"
    )
    return {
        "computation": computation,
        "keys": entry["keys"],
        "digest": entry["digest"],
        "file": entry["file"],
        "unchanged": True,
    }


def load(
    run_dir: str,
    spec: ComputationSpec,
    source: Any,
    *,
    force: bool = False,
    log: Any = None,
) -> dict[str, Any]:
    """Load ``source`` (anything ``initial_state=`` takes, or an :class:`InitialState`) as the
    initial state of ``spec``'s computation in the stopped run ``run_dir`` (module
    docstring); returns what was done. ``force``: skip the check that no driver runs."""
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    root = Location.of(run_dir)
    computation = spec.name
    initial = (
        source
        if isinstance(source, InitialState)
        else InitialState(computation, source, columnar=_is_columnar(spec))
    )
    if not read_pin(root):
        msg = f"{root.uri} has no run.json: not a run directory, or never started (give the topology's computation initial_state=... instead)"
        raise refuse(msg)
    if (running := driver_running(root, force)) is not None:
        raise refuse(running)
    leases = root.child("leases")
    epoch = DriverEpoch(leases)
    lease = Lease(leases.child(computation), f"computation {computation!r} (millwheel state load)")
    lease.acquire(epoch.get())
    try:
        checkpoint = root.child("checkpoints", computation)
        return _write(
            root, spec, initial, offline_outbox(root, computation, checkpoint, lease), say, t0
        )
    finally:
        epoch.mark(stopped=True)


def _is_columnar(spec: ComputationSpec) -> bool:
    from millwheel._columnar import is_columnar

    return is_columnar(spec.cls)


def bootstrap_at_start(query: Any) -> None:
    """At a driver's start of ``query``'s computation (its lease held, ``run.json`` pinned):
    finish or check a pinned load, or load the topology's ``initial_state`` if the
    computation has committed no batch. Refused once it has: the initial state cannot be
    loaded any more, and running without it would silently drop it."""
    rt, name = query.rt, query.name
    root = rt.root
    entry = pinned(read_pin(root), name)
    committed = committed_batches(query.checkpoint)
    if entry is not None:
        _check_pinned(entry, name, query.heartbeats, committed, rt.log)
        return
    topology = getattr(rt, "topology", None)
    initial = None if topology is None else topology.initial_states.get(name)
    if initial is None:
        return
    if committed:
        msg = (
            f"computation {name!r} has an initial_state in the topology, but it has committed {len(committed)} batches in "
            f"{root.uri} without one: its state is its own now. Remove initial_state=... to resume it, or start a new run directory"
        )
        raise refuse(msg)
    _write(root, query.spec, initial, query.outbox, rt.log, time.perf_counter())


def load_main(argv: list[str]) -> int:
    """``millwheel state load RUN C SOURCE --topology T``."""
    p = argparse.ArgumentParser(
        prog="millwheel state load",
        description=(
            "bootstrap a computation's state before its first batch: each key's state of SOURCE "
            "(Parquet, JSON lines, `millwheel state --json` output) through its own codec, exactly once"
        ),
    )
    p.add_argument("run", help="the run directory")
    p.add_argument("computation", help="the computation to bootstrap")
    p.add_argument("source", help="a .parquet, .jsonl or .json file, or a directory of them")
    p.add_argument(
        "--topology",
        required=True,
        help="the topology file: the computation's kind, codec and options say how its state is written",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="skip the check that no driver runs (a driver on another host that you know has stopped)",
    )
    args = p.parse_args(argv)
    try:
        from millwheel._runner import load_topology

        topology = load_topology(args.topology)
        spec = topology.computations.get(args.computation)
        if spec is None:
            msg = f"topology {topology.name!r} has no computation {args.computation!r} (its computations: {', '.join(topology.computations) or 'none'})"
            raise refuse(msg)
        done = load(
            args.run,
            spec,
            args.source,
            force=args.force,
            log=lambda m: print(f"millwheel state load: {m}", file=sys.stderr),
        )
    except MillwheelError as exc:
        print(f"millwheel state load: {exc}", file=sys.stderr)
        return 2
    verb = "already loaded" if done.get("unchanged") else "loaded"
    print(
        f"{verb}: {done['keys']:,} keys of {args.computation} (digest {done['digest']}, {done['file']}) in {done['seconds']:.1f}s"
    )
    return 0
