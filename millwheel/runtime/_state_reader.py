"""``millwheel state RUN COMPUTATION [--key K]``: a computation's committed per-key state.

Reads what the last committed micro-batch of the computation's query left in Spark's
state store (``_spark_internals.read_interval_states`` for interval rows,
``read_envelopes`` for the per-key layout) and
decodes each key's envelope (``millwheel/_envelope.py``) — or, for a columnar
computation, each key's share of its interval's store (``millwheel/_colstore.py``; on the
Arrow mapping, the store files its last committed manifest names, ``_colfiles.py``):
the user state, the pending timers, the dedup ids kept for exactly-once (§6.1.1), the
oldest timestamp the key holds the low watermark at (§7.2), and the output of committed
batches that the driver has not published yet. Read-only, and safe while the run goes on:
it reads a committed version, and its own Spark session (``local[1]``, no UI) writes
nothing into the run directory.

The state is decoded with the pickle codec, else the msgpack codec; a computation with
another codec needs ``--topology T`` (its options say the codec; state of an older version
is then shown upgraded, as that code reads it). Each key's stored *state version* is shown
(``millwheel/_versions.py``: the version of the code that stored its state; a columnar
computation's, per store, ``_colversions.py``), with a count of keys per version: no key of
version N left means an ``upgrade_from_N`` is no longer needed by this run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from millwheel._codec import MsgpackCodec, PickleCodec
from millwheel._envelope import Envelope
from millwheel._errors import MillwheelError
from millwheel._record import Key, TimeDomain, decode_key, timestamp_text
from millwheel._versions import split_version, stored_version
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._outbox import _numbers, staged_version
from millwheel.runtime._sinks import jsonable, run_argument, run_directory
from millwheel.runtime._spark_internals import (
    STATE,
    committed_batches,
    read_envelopes,
    read_interval_states,
)
from millwheel.runtime._wire import SUMMARY_STREAM

SHOWN = 160


@dataclass
class KeyState:
    """One key's committed envelope, decoded."""

    key: Key
    state: Any
    #: tag -> (timestamp, "low_watermark" | "wall_time")
    timers: dict[str, tuple[int, str]]
    dedup_ids: int
    hold: int | None
    pending_productions: int
    state_bytes: int
    undecodable: str | None = None
    #: the version of the code that stored the state (``None``: no state)
    version: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": jsonable(self.key),
            "state": jsonable(self.state),
            "timers": {
                tag: {"ts": ts, "domain": d}
                for tag, (ts, d) in sorted(self.timers.items(), key=lambda x: x[1][0])
            },
            "dedup_ids": self.dedup_ids,
            "hold": self.hold,
            "pending_productions": self.pending_productions,
            "state_bytes": self.state_bytes,
            "version": self.version,
            **({"undecodable": self.undecodable} if self.undecodable else {}),
        }


@dataclass
class ComputationState:
    """A computation's committed state as of one batch."""

    computation: str
    batch: int | None
    keys: list[KeyState]
    #: committed but not yet published output rows, by stream
    unpublished: dict[str, int] = field(default_factory=dict)


def computations_of(root: Location) -> list[str]:
    return sorted(
        n for n in root.child("checkpoints").list() if not n.startswith((".", "_", "injector."))
    )


def _decoder(codec: Any | None) -> Callable[[bytes], tuple[Any, str | None]]:
    codecs: list[Any] = [codec] if codec is not None else [PickleCodec(), MsgpackCodec()]

    def decode(raw: bytes) -> tuple[Any, str | None]:
        problem = None
        if codec is None:
            raw = split_version(raw)[1]  # the stored value, not upgraded: no code to upgrade it
        for c in codecs:
            try:
                return c.decode(raw), None
            except Exception as exc:  # noqa: BLE001 - say which codec failed and go on
                problem = f"{type(c).__name__}: {type(exc).__name__}: {exc}"
        return (
            None,
            f"cannot decode {len(raw)} bytes of state ({problem}); pass --topology T to use its codec",
        )

    return decode


def decode_envelope(
    key: Key, raw: bytes, decode: Callable[[bytes], tuple[Any, str | None]]
) -> KeyState:
    env = Envelope.decode(raw)
    state, problem = (None, None) if env.state is None else decode(env.state)
    timers = {
        tag: (ts, TimeDomain(domain).name.lower()) for tag, (ts, domain) in env.timers.items()
    }
    return KeyState(
        key,
        state,
        timers,
        env.dedup.count,
        env.hold(),
        len(env.pending),
        len(env.state or b""),
        problem,
        stored_version(env.state),
    )


def columnar_key_states(blobs: list[bytes]) -> list[KeyState]:
    """Every key of a columnar computation's stores (one per key interval,
    ``millwheel/_colstore.py``): its state rows (without the encoded key column), its
    timers, its dedup ids, its hold (timers and pending productions included, as an
    envelope's) and its pending productions."""
    import numpy as np

    from millwheel._colstore import ColumnarStore

    out: list[KeyState] = []
    for blob in blobs:
        st = ColumnarStore.decode(blob)
        kbs = st.keys_held()
        rows: dict[bytes, list[dict[str, Any]]] = {}
        sizes: dict[bytes, int] = {}
        if st.state is not None and st.state.num_rows:
            user = st.state.drop_columns(["_kb"])
            per_row = user.nbytes / max(1, user.num_rows)
            for kb, row in zip(st.state.column("_kb").to_pylist(), user.to_pylist(), strict=True):
                rows.setdefault(kb, []).append(row)
                sizes[kb] = sizes.get(kb, 0) + int(per_row)
        timers: dict[bytes, dict[str, tuple[int, str]]] = {}
        for (kb, tag), (ts, domain) in st.timers.items():
            timers.setdefault(kb, {})[tag] = (ts, TimeDomain(domain).name.lower())
        ids = (
            dict(
                zip(
                    st.dedup.keys,
                    np.bincount(st.dedup.kix, minlength=len(st.dedup.keys)).tolist(),
                    strict=True,
                )
            )
            if len(st.dedup)
            else {}
        )
        pending: dict[bytes, int] = {}
        for p in st.pending:
            pending[p[1]] = pending.get(p[1], 0) + 1
        summary = st.key_summary(kbs)
        for kb in kbs:
            r = rows.get(kb)
            state = None if r is None else r[0] if len(r) == 1 else r
            out.append(
                KeyState(
                    decode_key(kb),
                    state,
                    timers.get(kb, {}),
                    ids.get(kb, 0),
                    summary[kb][0],
                    pending.get(kb, 0),
                    sizes.get(kb, 0),
                    version=st.state_version if kb in rows else None,
                )
            )
    return out


def arrow_mapping_stores(root: Location, computation: str) -> tuple[int | None, list[bytes]]:
    """``(batch, store blobs)`` of a computation on the Arrow mapping as of its last
    committed batch (the manifest that batch wrote, ``_colfiles.py``); a store collected by a
    later batch while it was read means the run moved on: read the newer manifest."""
    from millwheel.runtime._colfiles import STATE_DIR, ColumnarFiles

    files = ColumnarFiles(root.child(STATE_DIR, computation))
    for _ in range(5):
        committed = committed_batches(root.child("checkpoints", computation))
        if not committed:
            return None, []
        manifest = files.manifest_before(committed[-1] + 1, set(committed))
        try:
            return manifest.batch, [
                files.read_store(i, name) for i, name in sorted(manifest.files.items())
            ]
        except MillwheelError:
            continue
    msg = f"the columnar stores of {computation!r} kept changing while read (5 tries); try again"
    raise MillwheelError(msg)


def unpublished_output(root: Location, computation: str) -> dict[str, int]:
    """Rows of committed batches not published yet, by stream (read from the outbox)."""
    import pyarrow.parquet as pq

    outbox = root.child("outbox", computation)
    committed = set(committed_batches(root.child("checkpoints", computation)))
    out: dict[str, int] = {}
    for n in _numbers(outbox):
        if n not in committed:
            continue
        batch = staged_version(outbox.child(str(n)))
        if batch is None:
            continue
        try:
            for sub in batch.list():
                if not sub.startswith("stream=") or sub == f"stream={SUMMARY_STREAM}":
                    continue
                d = batch.child(sub)
                for part in d.list():
                    if part.endswith(".parquet") and not part.startswith((".", "_")):
                        with d.fs.open_input_file(d.child(part).path) as f:
                            out[sub[len("stream=") :]] = (
                                out.get(sub[len("stream=") :], 0)
                                + pq.ParquetFile(f).metadata.num_rows
                            )
        except (FileNotFoundError, OSError):
            continue  # published (and deleted) while we looked: nothing pending from it
    return out


def read_state(
    spark: Any, run: str, computation: str, *, codec: Any | None = None, key: Key | None = None
) -> ComputationState:
    """The committed state of ``computation`` in run directory ``run``."""
    root = Location.of(run)
    known = computations_of(root)
    if computation not in known:
        msg = f"run {run} has no computation {computation!r}; its computations: {', '.join(known) or 'none (is it a run directory?)'}"
        raise MillwheelError(msg)
    held = read_pin(root)
    if ((held.get("mappings") or {}).get(computation) or {}).get("mapping") == "arrow":
        batch, blobs = arrow_mapping_stores(root, computation)
        keys = columnar_key_states(blobs)
    else:
        checkpoint = root.child("checkpoints", computation)
        commits = committed_batches(checkpoint)
        batch = commits[-1] if commits else None
        what: str = "envelopes"
        states: dict[int, Any] = {}
        if batch is not None and checkpoint.child(STATE).exists():
            what, states = read_interval_states(spark, checkpoint.uri, batch)
        if what == "columnar":
            keys = columnar_key_states([b for b in states.values() if b is not None])
        else:
            if what == "keys":
                envelopes = {
                    decode_key(kb): env
                    for kb, env in read_envelopes(spark, checkpoint.uri, batch).items()
                }
            else:
                envelopes = {
                    decode_key(kb): env for envs in states.values() for kb, env in envs.items()
                }
            decode = _decoder(codec)
            keys = [decode_envelope(k, raw, decode) for k, raw in envelopes.items()]
    keys.sort(key=lambda ks: repr(ks.key))
    if key is not None:
        keys = [k for k in keys if k.key == key]
    return ComputationState(computation, batch, keys, unpublished_output(root, computation))


def parse_key(text: str) -> Key:
    """``--key``: JSON for an int or a list (a tuple key), else the text itself.

    >>> parse_key("cats"), parse_key("42"), parse_key('["cats", 3]'), parse_key('"42"')
    ('cats', 42, ('cats', 3), '42')
    """
    try:
        v = json.loads(text)
    except ValueError:
        return text
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        return v
    return text


def _short(v: Any, width: int = SHOWN) -> str:
    text = repr(v)
    return text if len(text) <= width else text[: width - 3] + "..."


def _version(k: KeyState) -> str:
    return "" if k.version is None else f", version {k.version}"


def render(cs: ComputationState, run: str, *, detail: bool, limit: int) -> str:
    lines = []
    where = f"batch {cs.batch}" if cs.batch is not None else "no committed batch yet"
    lines.append(
        f"computation {cs.computation} of run {run}: committed state as of {where} (read-only)"
    )
    timers = sum(len(k.timers) for k in cs.keys)
    lw_timers = sum(1 for k in cs.keys for _, d in k.timers.values() if d == "low_watermark")
    holds = [(k.hold, k.key) for k in cs.keys if k.hold is not None]
    oldest = min(holds, key=lambda h: h[0]) if holds else None
    lines.append(
        f"  keys {len(cs.keys):,} · pending timers {timers:,} ({lw_timers:,} low-watermark, {timers - lw_timers:,} wall-time)"
        f" · dedup ids {sum(k.dedup_ids for k in cs.keys):,}"
        + (
            f" · oldest hold {timestamp_text(oldest[0])} (key {oldest[1]!r})"
            if oldest
            else " · holds nothing"
        )
    )
    pending = sum(k.pending_productions for k in cs.keys)
    unpublished = ", ".join(f"{s} {n:,}" for s, n in sorted(cs.unpublished.items())) or "none"
    versions: dict[int, int] = {}
    for k in cs.keys:
        if k.version is not None:
            versions[k.version] = versions.get(k.version, 0) + 1
    if versions:
        lines.append(
            "  state versions: "
            + ", ".join(f"v{v} {n:,} keys" for v, n in sorted(versions.items()))
        )
    lines.append(
        f"  pending productions: {pending:,} in envelopes; committed output not yet published: {unpublished}"
    )
    shown = cs.keys if detail else cs.keys[:limit]
    for k in shown:
        if detail:
            lines.append(f"key {k.key!r}")
            lines.append(
                f"  state ({k.state_bytes:,} bytes{_version(k)}): {k.undecodable or _short(k.state, 2_000)}"
            )
            for tag, (ts, domain) in sorted(k.timers.items(), key=lambda x: x[1][0]):
                lines.append(
                    f"  timer {tag!r} at {timestamp_text(ts)} ({ts}, {domain.replace('_', ' ')})"
                )
            lines.append(
                f"  dedup ids {k.dedup_ids:,} · hold {timestamp_text(k.hold) if k.hold is not None else 'none'}"
                f" · pending productions {k.pending_productions}"
            )
        else:
            nxt = min((ts for ts, _ in k.timers.values()), default=None)
            lines.append(
                f"  {_short(k.key, 30):<30} timers {len(k.timers):>4} next {timestamp_text(nxt) if nxt is not None else '-':<19}"
                f" dedup {k.dedup_ids:>6} v{k.version if k.version is not None else '-'}"
                f" state {k.undecodable or _short(k.state, 60)}"
            )
    if not detail and len(cs.keys) > limit:
        lines.append(
            f"  ... {len(cs.keys) - limit:,} more keys (--limit N, or --key K for one key, --json for all)"
        )
    return "\n".join(lines)


#: ``millwheel state load|rewrite ...``: the subcommands that write state, each in its own
#: module (imported when asked for): ``_state_load.py`` (bootstrap), ``_state_rewrite.py``
SUBCOMMANDS = {
    "load": ("millwheel.runtime._state_load", "load_main"),
    "rewrite": ("millwheel.runtime._state_rewrite", "rewrite_main"),
}


def state_main(argv: list[str]) -> int:
    """``millwheel state``: a computation's committed per-key state, timers and dedup ids
    (``millwheel state load|rewrite ...``: :data:`SUBCOMMANDS`)."""
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        module, function = SUBCOMMANDS[argv[0]]
        return int(getattr(importlib.import_module(module), function)(argv[1:]))
    p = argparse.ArgumentParser(
        prog="millwheel state",
        description="print a computation's committed per-key state (read-only, safe during a run)",
        epilog="write state, subcommands {load,rewrite}: `millwheel state load RUN C SOURCE --topology T` (bootstrap before the first batch), `millwheel state rewrite RUN C --with module:function` (offline, --undo); each has its --help",
    )
    run_argument(p)
    p.add_argument(
        "computation", nargs="?", help="the computation (without it: list the run's computations)"
    )
    p.add_argument(
        "--key",
        default=None,
        help="only this key (JSON for an int or a tuple key: 42, '[\"cats\", 3]')",
    )
    p.add_argument("--limit", type=int, default=20, help="keys shown in the table (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON: one object with every key")
    p.add_argument(
        "--topology", default=None, help="the topology file, to decode state with its codec"
    )
    args = p.parse_args(argv)
    try:
        root = run_directory(args.run, "checkpoints")
        if args.computation is None:
            for name in computations_of(root):
                print(name)
            return 0
        codec = None
        if args.topology:
            from millwheel._runner import load_topology

            spec = load_topology(args.topology).computations.get(args.computation)
            codec = spec.options.state_codec if spec is not None else None
        key = parse_key(args.key) if args.key is not None else None
        from millwheel.runtime._session import spark_session

        jvm_log = os.path.join(tempfile.gettempdir(), f"millwheel-state-{os.getuid()}.log")
        spark = spark_session(
            "local[1]", shuffle_partitions=1, app_name="millwheel-state", jvm_log=jvm_log
        )
        cs = read_state(spark, args.run, args.computation, codec=codec, key=key)
        # an offline rewrite not yet committed by a batch (``_rewrite_pin.py``): its state is shown
        rewrite = (read_pin(root).get("rewrites") or {}).get(args.computation)
        if args.json:
            print(
                json.dumps(
                    {
                        "computation": cs.computation,
                        "batch": cs.batch,
                        "unpublished": cs.unpublished,
                        "keys": [k.as_dict() for k in cs.keys],
                        **({"rewrite": rewrite} if rewrite else {}),
                    },
                    ensure_ascii=False,
                    indent=1,
                )
            )
        elif key is not None and not cs.keys:
            print(
                f"computation {cs.computation}: no committed state for key {key!r} (as of batch {cs.batch})"
            )
            return 1
        else:
            print(render(cs, args.run, detail=key is not None, limit=args.limit))
            if rewrite:
                print(
                    f"  rewritten by {rewrite.get('function')} as of batch {rewrite.get('batch')} ({rewrite.get('step')}): "
                    f"{rewrite.get('keys')} keys kept, {rewrite.get('deleted')} deleted; "
                    f"millwheel state rewrite {args.run} {args.computation} --undo puts the old state back until a batch commits"
                )
    except MillwheelError as exc:
        print(f"millwheel state: {exc}", file=sys.stderr)
        return 2
    return 0
