"""What ``run.json`` binds a run directory to from its first start: the settings its state
depends on (:data:`PINNED_SETTINGS`), its pipeline name and epoch (once-tokens), the Spark
group of each key interval (``docs/runtime.md``). Each is refused if a later start differs.
"""

from __future__ import annotations

import enum
import json
import socket
from typing import Any

import xxhash

from millwheel._errors import MillwheelError
from millwheel._once import new_epoch
from millwheel.runtime._fs import Location
from millwheel.runtime._settings import RuntimeSettings, default_intervals
from millwheel.runtime._spark_internals import has_started
from millwheel.runtime._wire import interval_groups

__all__ = [
    "PINNED_SETTINGS",
    "pin_groups",
    "pin_pipeline",
    "pin_run_settings",
    "run_identity",
    "where_of",
]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


#: what a run directory is bound to from its first start (``run.json``): the key intervals
#: decide which Spark group and which ``interval:C`` column each key's state and input
#: belong to, and the state layout decides the state stores' schema and provider
PINNED_SETTINGS = ("intervals", "state_layout")


def resolve_intervals(settings: RuntimeSettings, held: dict[str, Any], master: str | None) -> int:
    """A run's key intervals: ``settings``' if given; else the run directory's own (``held``:
    its ``run.json``), so a run resumes as it started whatever machine it is on; else, on a
    first start, :func:`~millwheel.runtime._settings.default_intervals` of ``master``."""
    if settings.intervals is not None:
        return settings.intervals
    n = held.get("intervals")
    return int(n) if n else default_intervals(master)


def pin_run_settings(root: Location, settings: RuntimeSettings) -> None:
    """Record :data:`PINNED_SETTINGS` in ``run.json`` on a run directory's first start, and
    refuse to resume it with others.

    Resuming with another interval count would put keys in groups whose state stores do not
    hold their state and read input keyed for the old count (``docs/runtime.md``); another
    layout would meet state stores of the other schema. Both fail late and obscurely inside
    Spark, or worse, not at all — so they are refused here, before anything is written.
    A run directory from before ``run.json`` gets one written with the settings it resumes with.
    """
    # an enum setting (``StateLayout``) as its string: run.json and its messages keep the words
    wanted = {name: _plain(getattr(settings, name)) for name in PINNED_SETTINGS}
    pin = root.child("run.json")
    text = pin.read_text()
    if text is None:
        root.mkdirs()
        pin.write_text(json.dumps(wanted, indent=1) + "\n")
        return
    try:
        held = json.loads(text)
    except ValueError as exc:
        msg = f"{pin.uri} is not JSON ({exc}); it records the settings the run directory was started with"
        raise MillwheelError(msg) from None
    differ = [
        f"{k}={held[k]!r} (this run: {wanted[k]!r})"
        for k in PINNED_SETTINGS
        if k in held and held[k] != wanted[k]
    ]
    if differ:
        msg = (
            f"run directory {root.uri} was started with {', '.join(differ)}; "
            "resume it with the same settings, or start the new settings in a new run directory"
        )
        raise MillwheelError(msg)
    if any(k not in held for k in PINNED_SETTINGS):
        pin.write_text(json.dumps({**wanted, **held}, indent=1) + "\n")


def pin_pipeline(root: Location, name: str) -> tuple[str, str]:
    """This run directory's pipeline name and epoch (Photon §2; ``millwheel/_once.py``), kept in ``run.json``.

    The epoch is drawn on the directory's first start and enters every once-token, so a
    replay commits with the same tokens and another run directory never does. A run
    directory deleted (its checkpoint lost) and started again under the same name is a new
    epoch: its commits conflict with the old epoch's instead of repeating them. One that
    lost only its checkpoints but keeps its published output is refused (resuming it would
    mix two runs). A directory from before epochs keeps its bare name (the tokens it
    committed with); one started under another pipeline name is refused.
    """
    pin = root.child("run.json")
    held = json.loads(pin.read_text() or "{}")
    if held.get("pipeline", name) != name:
        msg = (
            f"run directory {root.uri} belongs to pipeline {held['pipeline']!r}, not {name!r}: its commits are that "
            "pipeline's; resume it under its name, or start this pipeline in a new run directory"
        )
        raise MillwheelError(msg)
    checkpoints = root.child("checkpoints")
    has_state = checkpoints.exists() and bool(checkpoints.list())
    epoch = held.get("epoch")
    if epoch is None:
        epoch = "" if has_state else new_epoch()  # a directory from before epochs keeps its tokens
    elif not has_state:
        published = root.child("tallies")
        if published.exists() and published.list():
            msg = (
                f"run directory {root.uri} has lost its checkpoints but still holds published output and counters; "
                "resuming it would mix two runs. Restore the checkpoints, or delete the whole run directory to start "
                "it again (a new epoch: its commits conflict with the old run's, and verification recovers what the "
                "old run registered and never wrote)"
            )
            raise MillwheelError(msg)
        epoch = new_epoch()  # first start (or one that died before its first batch): a new epoch
    if held.get("epoch") != epoch or held.get("pipeline") != name:
        pin.write_text(json.dumps({**held, "pipeline": name, "epoch": epoch}, indent=1) + "\n")
    return name, epoch


def where_of(root: Location) -> str:
    """Where a run directory is, for the registry's roster: host and path (bounded)."""
    where = f"{socket.gethostname()}:{root.uri}"
    return (
        where if len(where) <= 160 else f"{where[:100]}…{xxhash.xxh3_64_hexdigest(where.encode())}"
    )


def run_identity(root: str) -> tuple[str, str, str] | None:
    """A run directory's pipeline name, epoch and roster place (:func:`pin_pipeline`,
    :func:`where_of`), or ``None`` if it has never started."""
    loc = Location.of(root)
    held = json.loads(loc.child("run.json").read_text() or "{}")
    if "pipeline" not in held:
        return None
    return held["pipeline"], held.get("epoch") or "", where_of(loc)


def pin_groups(root: Location, intervals: int, partitions: int) -> list[int]:
    """The Spark grouping value of each key interval, pinned in ``run.json`` (``"groups"``).

    A run directory's first start deals its intervals round-robin over the session's
    shuffle partitions (:func:`~millwheel.runtime._wire.interval_groups`); the grouping
    value is the key of each interval's state-store rows, and Spark keeps the partition
    count a checkpoint started with, so both hold for the directory's life. A directory
    whose queries started before groups were pinned grouped by the interval number itself
    and keeps doing so.
    """
    pin = root.child("run.json")
    held = json.loads(pin.read_text() or "{}")
    groups = held.get("groups")
    if groups is None:
        started = any(
            has_started(root.child("checkpoints", n)) for n in root.child("checkpoints").list()
        )
        groups = list(range(intervals)) if started else interval_groups(intervals, partitions)
        pin.write_text(json.dumps({**held, "groups": groups}, indent=1) + "\n")
    if len(groups) != intervals:
        msg = f"{pin.uri} pins {len(groups)} key-interval groups for {intervals} intervals; it was edited by hand or is damaged"
        raise MillwheelError(msg)
    return [int(g) for g in groups]
