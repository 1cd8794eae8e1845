"""``millwheel state rewrite``: apply a function to every key of a stopped run's computation, atomically.

::

    millwheel state rewrite RUN C --with module:function [--topology T]
    millwheel state rewrite RUN C --undo

``function(key, state, timers) -> (state, timers) | None`` (``_rewrite_apply.py``: user
types, ``None`` deletes the key) is applied to every key the computation ``C`` holds as
of its last committed batch, and the result is the state the run's next start resumes
from (docs/concepts.md, "Offline rewrite"; docs/runtime.md, "Rewriting state offline"):

1. **Fence and settle**, as ``millwheel rescale`` does (``_settle.py``): refused while a
   driver may run the run directory (``_lease.live_drivers``); ``C``'s lease under a new
   driver epoch; every committed batch published (unpublished output goes out first); a
   batch planned and never committed dropped, so the next start plans it anew on the new state.
2. **Read** every key at the last committed batch ``B`` (Spark's state data source: the
   interval rows, the per-key rows, or a columnar computation's interval stores) and
   **apply** the function on Spark (``mapInArrow``, :class:`~millwheel.runtime._rewrite_apply.RewriteTask`).
3. **Build** the new store with the computation's own operator in a one-batch scratch
   query (``_relayout.build_store``, the installers of ``_install.py`` or
   :class:`~millwheel.runtime._rewrite_apply.StoreInstaller`) and **graft** it as version
   ``B + 1`` beside the live store (``<checkpoint>/.state.rewrite``).
4. **Pin and swap** (``_rewrite_pin.py``): ``run.json`` records the rewrite
   (``"step": "swapping"``), the live store goes aside as ``.state.prewrite`` and the new one
   takes its place, then ``"pending"``.

Crash safety: before ``run.json`` records it nothing the run reads has changed (the
scratch query and the staged store are hidden names, redone by the next attempt); after
it, the next driver start or command finishes the swap (``settle_rewrite``), each step of
which can be redone. So a kill -9 anywhere leaves the old state or the new, never a mix.

``--undo`` puts the old store back, until a batch after ``B`` commits (then the old store
is deleted and ``--undo`` refused). A rewrite while one is pending **stacks**: it reads the
pending state and rewrites that; ``--undo`` restores the state the run left, before the
first. A computation on the Arrow mapping is rewritten in its own files (``_rewrite_arrow.py``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from millwheel._codec import MsgpackCodec, PickleCodec
from millwheel._errors import EnvelopeError, MillwheelError
from millwheel._versions import split_version, with_version
from millwheel.runtime._consumed import ConsumedFiles
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import interval_of
from millwheel.runtime._layout import Layout, computation_layouts, read_pin
from millwheel.runtime._lease import DriverEpoch, Lease, driver_running
from millwheel.runtime._outbox import crash_point
from millwheel.runtime._rewrite_apply import (
    REWRITE_INPUT,
    RewriteError,
    RewriteTask,
    apply_on_spark,
    refuse,
    settled,
)
from millwheel.runtime._rewrite_pin import (
    PRIOR,
    STAGED,
    mark_step,
    pending_rewrite,
    pin_rewrite,
    settle_rewrite,
    swap_back,
    swap_in,
    unpin_rewrite,
)
from millwheel.runtime._spark_internals import (
    committed_batches,
    offset_log_conf,
    read_envelopes,
    read_interval_states,
)
from millwheel.runtime._state_files import graft_state

__all__ = ["load_function", "rewrite", "rewrite_main", "undo"]


def _check(root: Location, computation: str) -> tuple[dict[str, Any], Layout, str]:
    """``(run.json, C's layout, its mapping)``, or a refusal saying why ``C`` cannot be rewritten."""
    held = read_pin(root)
    if not held:
        raise refuse(
            computation, f"{root.uri} has no run.json: not a run directory, or never started"
        )
    checkpoint = root.child("checkpoints", computation)
    if not checkpoint.exists():
        ckpts = root.child("checkpoints")
        known = sorted(n for n in ckpts.list() if not n.startswith(".")) if ckpts.exists() else []
        raise refuse(
            computation,
            f"run directory {root.uri} has no such computation (its computations: {known})",
        )
    if "groups" not in held or "intervals" not in held:
        msg = f"{root.child('run.json').uri} does not pin the run's key intervals; start the run once with this millwheel first"
        raise refuse(computation, msg)
    layout = computation_layouts(
        held, [computation], int(held["intervals"]), [int(g) for g in held["groups"]]
    )[computation]
    migration = layout.migration or {}
    if migration.get("relayout", "done") != "done":
        msg = f"its change of state layout was interrupted; finish it first (millwheel rescale {root.uri} --computation {computation} --layout {layout.state_layout})"
        raise refuse(computation, msg)
    if migration and "relayout" not in migration and not migration.get("moved"):
        consumed = ConsumedFiles(checkpoint)
        consumed.refresh()
        committed = committed_batches(checkpoint)
        if migration["file"] not in consumed.heartbeat_names(committed[-1] if committed else -1):
            msg = f"its rescale to {layout.intervals} key intervals has not moved its state yet ({migration['file']}); resume the run until a batch has moved it, then rewrite"
            raise refuse(computation, msg)
    mapping = ((held.get("mappings") or {}).get(computation) or {}).get("mapping", "default")
    return held, layout, mapping


@contextmanager
def _fenced(root: Location, computation: str, force: bool, what: str) -> Iterator[Lease]:
    """``computation``'s lease under a new driver epoch, once no driver runs (a zombie driver
    of it is fenced from here on); the epoch is marked stopped at the end."""
    if (running := driver_running(root, force)) is not None:
        raise refuse(computation, running)
    leases = root.child("leases")
    epoch = DriverEpoch(leases)
    lease = Lease(leases.child(computation), f"computation {computation!r} ({what})")
    lease.acquire(epoch.get())
    try:
        yield lease
    finally:
        epoch.mark(stopped=True)


def _rows(
    spark: Any, computation: str, checkpoint: Location, layout: Layout, last: int
) -> tuple[pa.Table, bool]:
    """Every key's envelope (or every interval's columnar store, key null) at committed
    batch ``last``, with the Spark group it is kept under: :data:`REWRITE_INPUT`; and whether columnar."""
    groups, n = list(layout.groups), layout.intervals
    group: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes] = []
    columnar = False
    if layout.state_layout == "keys":
        envs = read_envelopes(spark, checkpoint.uri, last)
    else:
        what, states = read_interval_states(spark, checkpoint.uri, last)
        stray = sorted(set(states) - set(groups))
        if stray:
            msg = f"its state has groups {stray} that its layout in run.json ({groups}) does not: run.json was changed by hand, or the checkpoint is not the one it describes"
            raise refuse(computation, msg)
        if what == "columnar":
            columnar = True
            for g, blob in sorted(states.items()):
                if blob is not None:
                    group.append(g)
                    keys.append(None)
                    values.append(blob)
            envs = {}
        else:
            envs = {kb: env for s in states.values() for kb, env in s.items()}
    for kb, env in envs.items():
        group.append(groups[interval_of(kb, n)])
        keys.append(kb)
        values.append(env)
    table = pa.table(
        {
            "group": pa.array(group, pa.int32()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
        },
        schema=REWRITE_INPUT,
    )
    return table, columnar


def rewrite(
    run_dir: str,
    computation: str,
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    codec: Any = None,
    options: Any = None,
    spark: Any = None,
    force: bool = False,
    log: Any = None,
) -> dict[str, Any]:
    """Apply ``fn`` to every key of ``computation`` of the stopped run in ``run_dir`` (see the
    module docstring); returns what was done (keys read, kept, deleted, batch, seconds...).

    ``codec``: the computation's state codec (default: pickle, else msgpack, as each key's
    state decodes); ``options``: its ``ComputationOptions`` (a columnar store's dedup
    settings); ``spark``: the session to read, apply and build with (default: a local one)."""
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    label = str(name or getattr(fn, "__qualname__", repr(fn)))
    root = Location.of(run_dir)
    held, layout, mapping = _check(root, computation)
    checkpoint = root.child("checkpoints", computation)
    with _fenced(root, computation, force, "millwheel state rewrite") as lease:
        settle_rewrite(root, computation, checkpoint, say)
        prior = pending_rewrite(read_pin(root), computation)
        last = settled(root, computation, checkpoint, lease, say)
        if last < 0:
            msg = "it has committed no batch yet: there is no state to rewrite (a computation that has not started is seeded with millwheel state load)"
            raise refuse(computation, msg)
        if spark is None:
            from millwheel.runtime._session import command_session

            spark = command_session()
        task = RewriteTask(fn, label, codec or _AnyCodec(), options, columnar=False)
        if mapping == "arrow":
            from millwheel.runtime._rewrite_arrow import rewrite_arrow

            out = rewrite_arrow(root, computation, checkpoint, task, spark, last, lease, prior, say)
        else:
            out = _rewrite_store(
                root, computation, checkpoint, layout, task, spark, last, lease, prior, say
            )
    out.update(computation=computation, function=label, seconds=time.perf_counter() - t0)
    say(
        f"computation {computation!r}: {out['keys']} keys rewritten by {label} ({out['deleted']} deleted) as of batch {last}; "
        f"the next start resumes from them (undo: millwheel state rewrite {root.uri} {computation} --undo)"
    )
    return out


def _rewrite_store(
    root: Location,
    computation: str,
    checkpoint: Location,
    layout: Layout,
    task: RewriteTask,
    spark: Any,
    last: int,
    lease: Lease,
    prior: dict[str, Any] | None,
    say: Any,
) -> dict[str, Any]:
    """Steps 2-4 of the module docstring for a computation whose state is in Spark's state store."""
    from millwheel.runtime._relayout import build_store, install_table
    from millwheel.runtime._rewrite_apply import StoreInstaller

    t_read = time.perf_counter()
    try:
        table, columnar = _rows(spark, computation, checkpoint, layout, last)
    except (EnvelopeError, ValueError) as exc:
        raise refuse(computation, str(exc)) from None
    read_s = time.perf_counter() - t_read
    crash_point(computation, "rewrite_read", last)
    task.columnar = columnar
    t_apply = time.perf_counter()
    result = apply_on_spark(spark, table, task)
    apply_s = time.perf_counter() - t_apply
    kept, deleted = (
        int(sum(result.column("kept").to_pylist())),
        int(sum(result.column("deleted").to_pylist())),
    )
    groups = list(layout.groups)
    state_layout = str(layout.state_layout)
    conf = offset_log_conf(checkpoint, last)
    partitions = int(conf.get("spark.sql.shuffle.partitions", 0)) or int(
        spark.conf.get("spark.sql.shuffle.partitions")
    )
    store_conf = {k: v for k, v in conf.items() if ".stateStore." in k}
    rows = result.filter(result.column("value").is_valid())
    if columnar:
        install = pa.table(
            {
                "group": rows.column("group").cast(pa.int32()),
                "key": pa.nulls(rows.num_rows, pa.binary()),
                "value": rows.column("value"),
            }
        )
        if install.num_rows == 0:
            install = pa.table(
                {
                    "group": pa.array([groups[0]], pa.int32()),
                    "key": pa.nulls(1, pa.binary()),
                    "value": pa.nulls(1, pa.binary()),
                }
            )
        installer: Any = StoreInstaller(computation, groups)
    else:
        envs = dict(
            zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True)
        )
        install, installer = install_table(envs, groups), None
    scratch = root.child("checkpoints", f".{computation}.rewrite")
    t_build = time.perf_counter()
    installed = build_store(
        spark,
        scratch,
        computation,
        state_layout,
        groups,
        install,
        partitions,
        installer=installer,
        conf=store_conf,
    )
    if installed != kept:
        msg = f"the rewritten store holds {installed} keys, not the {kept} the function kept; nothing was changed"
        raise refuse(computation, msg)
    staged = checkpoint.child(STAGED)
    staged.delete()
    if prior is None:  # no rewrite pending: a kept store is of none (swap_in would keep it)
        checkpoint.child(PRIOR).delete()
    graft_state(
        scratch.child("checkpoint", "state"), staged, last + 1, final=checkpoint.child("state")
    )
    build_s = time.perf_counter() - t_build
    crash_point(computation, "rewrite_staged", last)
    lease.check()  # a driver started meanwhile fences this command: it changes nothing then
    entry = {
        "step": "swapping",
        "batch": last,
        "stacked": int((prior or {}).get("stacked", 0)) + 1,
        "function": task.name,
        "keys": kept,
        "deleted": deleted,
        "read": table.num_rows if not columnar else kept + deleted,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    pin_rewrite(root, computation, entry)
    crash_point(computation, "rewrite_pinned", last)
    swap_in(checkpoint, crash=lambda: crash_point(computation, "rewrite_swapping", last))
    mark_step(root, computation, "pending")
    scratch.delete()
    return {
        "batch": last,
        "keys": kept,
        "deleted": deleted,
        "stacked": entry["stacked"],
        "read_s": read_s,
        "apply_s": apply_s,
        "build_s": build_s,
    }


def undo(run_dir: str, computation: str, *, force: bool = False, log: Any = None) -> dict[str, Any]:
    """Put back the state ``computation`` had before its pending rewrite (before the first of
    stacked ones); refused once a batch after the rewrite has committed."""
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    root = Location.of(run_dir)
    held = read_pin(root)
    checkpoint = root.child("checkpoints", computation)
    if not held or not checkpoint.exists():
        raise refuse(computation, f"{root.uri} has no such computation (or is not a run directory)")
    with _fenced(root, computation, force, "millwheel state rewrite --undo") as lease:
        entry = pending_rewrite(read_pin(root), computation)
        if entry is None:
            raise refuse(
                computation,
                "it has no rewrite to undo: none was made, or a batch has committed since (the old state is gone then)",
            )
        arrow = entry.get("mapping") == "arrow"
        if not arrow and entry.get("step") == "swapping":
            swap_in(checkpoint)
        committed = committed_batches(checkpoint)
        if (
            not arrow
            and entry.get("step") != "undoing"
            and committed
            and committed[-1] > int(entry["batch"])
        ):
            settle_rewrite(root, computation, checkpoint, say)
            msg = f"the run committed batch {committed[-1]} after the rewrite (made at batch {entry['batch']}): it is part of the run now, and the old state is gone"
            raise refuse(computation, msg)
        if arrow:
            from millwheel.runtime._rewrite_arrow import undo_arrow

            undo_arrow(root, computation, checkpoint, entry, lease, say)
        else:
            if entry.get("step") != "undoing":
                settled(root, computation, checkpoint, lease, say)
                mark_step(root, computation, "undoing")
                crash_point(computation, "rewrite_undoing", int(entry["batch"]))
            swap_back(checkpoint)
            unpin_rewrite(root, computation)
    say(
        f"computation {computation!r}: its state is back as of batch {entry['batch']}, before {entry.get('function', 'the rewrite')}"
    )
    return {
        "computation": computation,
        "batch": int(entry["batch"]),
        "undone": int(entry.get("stacked", 1)),
        "seconds": time.perf_counter() - t0,
    }


class _AnyCodec:
    """Without the topology: each key's state decoded by pickle, else msgpack (what ``millwheel
    state`` shows without ``--topology``), as stored — a state version's header kept
    (``millwheel/_versions.py``) — and written back by the codec that read it, under the
    version it had."""

    def __init__(self) -> None:
        self.codecs: list[Any] = [PickleCodec(), MsgpackCodec()]
        self._last: tuple[Any, int] = (self.codecs[0], 1)

    def decode(self, data: bytes) -> Any:
        version, body = split_version(data)
        for c in self.codecs:
            try:
                value = c.decode(body)
            except Exception:  # noqa: BLE001, S112 - the next codec
                continue
            self._last = (c, version)
            return value
        msg = f"cannot decode {len(data)} bytes of state with pickle or msgpack; pass --topology T to use its codec"
        raise RewriteError(msg)

    def encode(self, value: Any) -> bytes:
        codec, version = self._last
        return with_version(version, codec.encode(value))


def load_function(spec: str, topology: str | None = None) -> tuple[Callable[..., Any], str]:
    """The function of ``module:function`` (importable, or from the topology file's directory)
    or ``path/to/file.py:function``; its module is pickled by value to Spark's workers."""
    target, sep, fname = spec.rpartition(":")
    if not sep or not target or not fname.isidentifier():
        msg = f"--with takes module:function or path/to/file.py:function, got {spec!r}"
        raise MillwheelError(msg)
    search = [str(Path(topology).resolve().parent)] if topology else []
    search.append(os.getcwd())
    for d in search:
        if d not in sys.path:
            sys.path.insert(0, d)
    try:
        if target.endswith(".py") or os.sep in target:
            path = Path(target)
            if not path.is_file():
                msg = f"--with {spec}: no file {target}"
                raise MillwheelError(msg)
            sys.path.insert(0, str(path.resolve().parent))
            name = f"_millwheel_rewrite_{path.stem}"
            mspec = importlib.util.spec_from_file_location(name, path)
            if mspec is None or mspec.loader is None:
                msg = f"--with {spec}: cannot import {target}"
                raise MillwheelError(msg)
            module = importlib.util.module_from_spec(mspec)
            sys.modules[name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ImportError as exc:
        msg = f"--with {spec}: cannot import {target}: {exc}"
        raise MillwheelError(msg) from None
    fn = getattr(module, fname, None)
    if not callable(fn):
        msg = f"--with {spec}: {target} has no function {fname}"
        raise MillwheelError(msg)
    from pyspark import cloudpickle

    if not module.__name__.startswith("millwheel"):
        cloudpickle.register_pickle_by_value(module)
    return fn, spec


def rewrite_main(argv: list[str]) -> int:
    """``millwheel state rewrite RUN C --with module:function`` (or ``--undo``)."""
    p = argparse.ArgumentParser(
        prog="millwheel state rewrite",
        description="apply function(key, state, timers) -> (state, timers) | None to every key of a stopped run's computation, "
        "atomically; the next start resumes from the result (--undo: put the old state back until a batch commits)",
    )
    p.add_argument("run", help="the run directory")
    p.add_argument("computation", help="the computation")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--with", dest="function", help="module:function or path/to/file.py:function")
    how.add_argument(
        "--undo", action="store_true", help="put back the state before the pending rewrite"
    )
    p.add_argument(
        "--topology",
        default=None,
        help="the topology file: the computation's codec, and where module:function is found",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="skip the check that no driver runs (one on another host you know has stopped)",
    )
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    args = p.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout)

    try:
        if args.undo:
            out = undo(args.run, args.computation, force=args.force, log=say)
        else:
            codec = options = None
            if args.topology:
                from millwheel._runner import load_topology

                spec = load_topology(args.topology).computations.get(args.computation)
                if spec is None:
                    msg = f"topology {args.topology} has no computation {args.computation!r}"
                    raise MillwheelError(msg)
                codec, options = spec.options.state_codec, spec.options
            fn, label = load_function(args.function, args.topology)
            out = rewrite(
                args.run,
                args.computation,
                fn,
                name=label,
                codec=codec,
                options=options,
                force=args.force,
                log=say,
            )
    except MillwheelError as exc:
        print(f"millwheel state rewrite: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
    return 0
