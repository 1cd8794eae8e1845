"""Each computation's key-interval layout, as ``run.json`` records it (docs/runtime.md, "Rescaling key intervals").

A run directory is bound at its first start to a run-wide interval count and its Spark
group values (``"intervals"``, ``"groups"``: ``_runtime.pin_run_settings``, ``pin_groups``).
``millwheel rescale`` (``_rescale.py``) gives one computation its own::

    "computations": {"C": {"intervals": 8, "groups": [...], "used_groups": [...],
                           "migration": {"file": "...", "from_intervals": 4, "authority": "pending"}}}

A computation without an entry has the run-wide layout. One with an entry groups its
query by its own groups, reports ``interval-<i>`` for ``i < intervals`` to the watermark
authority, and its producers key rows for it into ``interval:C@<intervals>``
(:func:`~millwheel.runtime._keying.key_columns`), so files written under another count
lack that column and are keyed again on read. ``used_groups`` is every group value the
computation's state has ever been kept under: a rescale picks new ones outside it.
``migration`` names the heartbeat file that moves the state into the new groups: until a
committed batch has read it the run cannot go on without it
(``ComputationQuery._check_migration``); ``"moved": true`` once a published batch has, and
``"authority": "done"`` once the old intervals are retired at the watermark authority.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location
from millwheel.runtime._settings import StateLayout

__all__ = [
    "HIDDEN_MOVE",
    "Layout",
    "computation_layouts",
    "finish_move",
    "move_pending",
    "pending_moves",
    "read_pin",
    "update_pin",
    "write_pin",
]

#: the hidden name a rescale's heartbeat file has until ``run.json`` names it (``_rescale.py``)
HIDDEN_MOVE = ".{}.rescale"

#: one read-modify-write of ``run.json`` at a time in this process: a driver's loop marks a
#: migration step while an online rescale (``_online.py``) gives another computation its layout
_PIN_LOCK = threading.RLock()


@dataclass(frozen=True)
class Layout:
    """One computation's key intervals: how many, and the Spark group value of each."""

    intervals: int
    groups: tuple[int, ...]
    #: has it its own layout (a rescale gave it one) rather than the run-wide one
    own: bool = False
    #: the heartbeat file of the rescale that made this layout, until a start has seen it consumed
    migration: dict[str, Any] | None = None
    #: where its envelopes live: the run's ``state_layout`` unless ``millwheel rescale
    #: --layout`` gave it its own (``_relayout.py``); a string is taken as its member
    state_layout: StateLayout | str = StateLayout.INTERVALS

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "state_layout", StateLayout.parse(self.state_layout, "run.json's state_layout")
        )


def read_pin(root: Location) -> dict[str, Any]:
    """``run.json`` as a dict (``{}`` before the first start)."""
    pin = root.child("run.json")
    text = pin.read_text()
    if text is None:
        return {}
    try:
        return json.loads(text)
    except ValueError as exc:
        msg = f"{pin.uri} is not JSON ({exc}); it records the settings the run directory was started with"
        raise MillwheelError(msg) from None


def write_pin(root: Location, held: dict[str, Any]) -> None:
    """Replace ``run.json`` atomically (``Location.write_text``)."""
    root.child("run.json").write_text(json.dumps(held, indent=1) + "\n")


def update_pin(root: Location, change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Read ``run.json``, apply ``change`` to it in place and write it back, under this
    process's lock (other processes never write a running run's ``run.json``: a rescale of
    a stopped run needs no driver, an online one is made by the driver)."""
    with _PIN_LOCK:
        held = read_pin(root)
        change(held)
        write_pin(root, held)
        return held


def own_intervals(held: dict[str, Any]) -> dict[str, int]:
    """The computations with their own interval count, and that count."""
    return {
        name: int(entry["intervals"]) for name, entry in (held.get("computations") or {}).items()
    }


def computation_layouts(
    held: dict[str, Any], names: list[str], intervals: int, groups: list[int]
) -> dict[str, Layout]:
    """Each of ``names``'s layout: its own from ``run.json``'s ``"computations"``, else the run-wide one."""
    own = held.get("computations") or {}
    run_layout = held.get("state_layout", "intervals")
    out: dict[str, Layout] = {}
    for name in names:
        entry = own.get(name)
        if entry is None:
            out[name] = Layout(intervals, tuple(groups), state_layout=run_layout)
            continue
        n, gs = int(entry["intervals"]), tuple(int(g) for g in entry["groups"])
        if len(gs) != n or len(set(gs)) != n:
            msg = f"run.json gives computation {name!r} {n} key intervals and the groups {list(gs)}; it was edited by hand or is damaged"
            raise MillwheelError(msg)
        out[name] = Layout(
            n,
            gs,
            own=True,
            migration=entry.get("migration"),
            state_layout=entry.get("state_layout", run_layout),
        )
    return out


def mark_migration(root: Location, computation: str, what: str, value: Any) -> None:
    """Record a step of ``computation``'s state move in ``run.json``: ``"authority": "done"``
    (its old intervals were retired at the watermark authority: later starts just acquire
    the new ones, ``ComputationQuery._acquire``), ``"moved": true`` (a committed batch read
    the move: starts stop looking for its file)."""
    with _PIN_LOCK:
        held = read_pin(root)
        migration = ((held.get("computations") or {}).get(computation) or {}).get("migration")
        if migration is not None and migration.get(what) != value:
            migration[what] = value
            write_pin(root, held)


def pending_moves(held: dict[str, Any]) -> list[str]:
    """The computations of ``run.json`` (``held``) whose rescale waits for its move batch
    (recorded, not yet read by a committed batch): a run must start for it, even one that
    had finished."""
    return sorted(
        name
        for name, entry in (held.get("computations") or {}).items()
        if move_pending((entry or {}).get("migration"))
    )


def move_pending(migration: dict[str, Any] | None) -> bool:
    """Does a computation's ``migration`` (``run.json``) wait for the batch that reads its
    state move? (A layout change, ``"relayout"``, moves its state itself.)"""
    if not migration:
        return False
    return "relayout" not in migration and not migration.get("moved")


def finish_move(heartbeats: Location, name: str) -> bool:
    """Rename a rescale's state move ``name`` into view if it is still hidden: ``run.json``
    names it, so it was written whole before (``_rescale.move_state``), and only the rename
    was lost (a kill -9 of the command or of the driver rescaling online). Returns whether
    it did."""
    hidden = heartbeats.child(HIDDEN_MOVE.format(name))
    if heartbeats.child(name).exists() or not hidden.exists():
        return False
    hidden.move_to(heartbeats.child(name))
    return True
