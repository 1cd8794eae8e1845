"""The worker side of ``millwheel rescale`` (``_rescale.py``): a state move's rows applied in one micro-batch.

A rescale writes one heartbeat file: an :attr:`~millwheel.runtime._wire.RowKind.INSTALL` row
per key for the group of its new key interval, a
:attr:`~millwheel.runtime._wire.RowKind.RETIRE` row per group of the old layout with the
digest of what it must hold. The interval step (``_interval.IntervalStep``) hands them
here before any record or timer of the batch runs; anything that does not fit fails the
batch before it commits (:class:`RescaleMismatch`), so a move is applied whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import xxhash

from millwheel._colstore import ColumnarStore
from millwheel._envelope import Envelope
from millwheel._errors import EnvelopeError, MillwheelError
from millwheel._options import DedupOptions
from millwheel._record import decode_key
from millwheel.runtime._keying import interval_of

__all__ = [
    "RescaleMismatch",
    "blob_digest",
    "envelope_meta",
    "install_envelopes",
    "install_stores",
    "retire_group",
    "state_digest",
]


class RescaleMismatch(MillwheelError, RuntimeError):
    """A rescale's rows met a state other than the one the rescale read: the batch fails
    before anything commits."""


def envelope_meta(
    env: bytes, dedup: DedupOptions | None = None
) -> tuple[int | None, int | None, int | None] | None:
    """``(hold, next low-watermark timer, next wall timer)`` of a stored key, read from its
    envelope (what the step keeps beside it as its ``KeyMeta``); ``None`` if it has
    nothing to schedule. The next low-watermark wake-up is also when a key without state
    can collect its ids, as the step says (``_step.py``), by the computation's ``dedup``
    options; not known (``None``: a relayout, a state load), as soon as the watermark
    passes its oldest id: too early is one step that collects nothing and sets the real
    time, too late would keep a key seen once for ever."""
    e = Envelope.decode(env)
    hold, next_lw, next_wall = e.schedule()
    slack, gc = (0, 0) if dedup is None else (dedup.slack_ms, dedup.gc_interval_ms)
    next_lw = e.collect_wake(next_lw, slack, gc)
    if hold is None and next_lw is None and next_wall is None:
        return None
    return hold, next_lw, next_wall


def state_digest(envs: dict[bytes, bytes]) -> list[int]:
    """``[keys, xxh3 of the sorted (key, envelope) pairs]``: what a key interval of the old
    layout must hold when a rescale empties it, so a state that is not the one the rescale
    read fails the batch instead of being lost."""
    h = xxhash.xxh3_64()
    for kb in sorted(envs):
        env = envs[kb]
        h.update(len(kb).to_bytes(4, "big"))
        h.update(kb)
        h.update(len(env).to_bytes(8, "big"))
        h.update(env)
    return [len(envs), h.intdigest()]


def blob_digest(blob: bytes | None) -> list[int]:
    """``[bytes, xxh3 of the bytes]`` of a columnar computation's store as committed (its
    interval row's ``envs``): what a key interval of the old layout must hold when a
    rescale empties it (``None``, no store: ``[0, xxh3 of nothing]``, as
    :func:`state_digest` of no envelopes)."""
    data = blob or b""
    return [len(data), xxhash.xxh3_64_intdigest(data)]


def install_envelopes(
    name: str,
    interval: int,
    intervals: int,
    installs: Sequence[tuple[bytes, bytes]],
    envs: dict[bytes, Any],
    meta: dict[bytes, Any],
    make_meta: Callable[..., Any],
    dedup: DedupOptions | None = None,
) -> None:
    """Put a rescale's ``installs`` into key interval ``interval``'s (empty) maps, each key's
    meta built by ``make_meta(hold, next lw timer, next wall timer)`` (``dedup``:
    :func:`envelope_meta`)."""
    if envs:
        msg = f"computation {name!r}: a rescale installs envelopes into key interval {interval}, which already holds {len(envs)} keys; the rescale must be redone"
        raise RescaleMismatch(msg)
    for kb, env in installs:
        if interval_of(kb, intervals) != interval:
            msg = f"computation {name!r}: a rescale sent key {decode_key(kb)!r} to key interval {interval} of {intervals}, not its own ({interval_of(kb, intervals)})"
            raise RescaleMismatch(msg)
        envs[kb] = env
        m = envelope_meta(env, dedup)
        if m is not None:
            meta[kb] = make_meta(*m)


def install_stores(
    name: str,
    interval: int,
    intervals: int,
    pieces: Sequence[bytes],
    current: Any,
    options: Any,
    upgrade: Any = None,
) -> ColumnarStore:
    """A columnar computation's share of a rescale: the store of key interval ``interval``
    merged from the ``pieces`` the rescale split off the old intervals' stores; the
    interval must hold nothing yet (``current``: its store, or ``None``), and every key must
    hash to it. ``upgrade(store)``: brings a piece's state rows to the code's state version
    (``_colversions.py``) before the merge, as pieces of stores written by different code
    versions may differ."""
    if current is not None:
        msg = f"computation {name!r}: a rescale installs columnar stores into key interval {interval}, which already holds a store; the rescale must be redone"
        raise RescaleMismatch(msg)
    try:
        decoded = [ColumnarStore.decode(p, options) for p in pieces]
        for st in decoded if upgrade is not None else ():
            upgrade(st)  # one that cannot be stays as it is: the merge says so if versions differ
        store = ColumnarStore.merge(decoded)
    except EnvelopeError as exc:
        msg = f"computation {name!r}: a rescale's pieces for key interval {interval} do not make one columnar store: {exc}"
        raise RescaleMismatch(msg) from exc
    wrong = [kb for kb in store.keys_held() if interval_of(kb, intervals) != interval]
    if wrong:
        msg = f"computation {name!r}: a rescale sent key {decode_key(wrong[0])!r} (and {len(wrong) - 1} more) to key interval {interval} of {intervals}, not its own ({interval_of(wrong[0], intervals)})"
        raise RescaleMismatch(msg)
    return store


def retire_group(
    name: str,
    intervals: int | None,
    retire: list[int] | None,
    other_rows: bool,
    state: Any,
    *,
    columnar: bool = False,
) -> None:
    """Empty a Spark group of the layout before a rescale (its ``GroupState``), once it
    holds what the rescale read (``retire``: :func:`state_digest`, or :func:`blob_digest`
    of a ``columnar`` computation's store)."""
    if retire is None or other_rows:
        msg = (
            f"computation {name!r}: a Spark group that is not a key interval of this layout ({intervals} intervals) "
            "got rows other than a rescale's retirement; the run directory's run.json and its heartbeat files disagree"
        )
        raise RescaleMismatch(msg)
    if columnar:
        held, what = blob_digest(state.get[0] if state.exists else None), "bytes of columnar store"
    else:
        held, what = (
            state_digest(
                msgpack.unpackb(state.get[0], raw=False, strict_map_key=False)
                if state.exists
                else {}
            ),
            "keys",
        )
    if held != retire:
        msg = (
            f"computation {name!r}: a group of the layout before the rescale holds {held[0]} {what} (digest {held[1]:x}), "
            f"not the {retire[0]} (digest {retire[1]:x}) the rescale read and moved; nothing was committed: "
            "restore run.json to the old layout and run millwheel rescale again"
        )
        raise RescaleMismatch(msg)
    if state.exists:
        state.remove()
