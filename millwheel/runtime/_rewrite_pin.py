"""A pending offline rewrite of a computation's state: its entry in ``run.json`` and the swap of its stores.

``millwheel state rewrite`` (``_state_rewrite.py``) builds a computation's rewritten
store beside the one the run left (``<checkpoint>/.state.rewrite``), then swaps the two
directories, keeping the old one as ``<checkpoint>/.state.prewrite`` for ``--undo``.
``run.json`` says where that stands, under ``"rewrites"``::

    "rewrites": {"C": {"step": "swapping" | "pending" | "undoing", "batch": B,
                       "stacked": 1, "function": "fix:repair", "keys": ..., "deleted": ...}}

* ``swapping`` — the new store is staged whole; the swap may be half done. Whoever comes
  next — the command again, ``--undo``, or a driver start (:func:`settle_rewrite`, from
  ``ComputationQuery.start``) — finishes it: every step of :func:`swap_in` can be redone.
* ``pending`` — swapped: the next start resumes from the new store; the old one is kept.
* ``undoing`` — ``--undo`` is putting the old store back (:func:`swap_back`, redoable).

Once a batch after ``B`` (the last committed batch the rewrite read) commits, the rewrite
is part of the run: the old store is deleted and the entry dropped (:func:`settle_rewrite`,
at the next start or command), and ``--undo`` is refused. A computation on the Arrow mapping
keeps its state in its own files (``_colfiles.py``): there the rewrite is one more manifest
of batch ``B`` (``"mapping": "arrow"``) and the old one is kept under
``colstate/<C>/.prewrite/`` (``_rewrite_arrow.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from millwheel.runtime._colfiles import STATE_DIR, ColumnarFiles, Manifest
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin, update_pin
from millwheel.runtime._spark_internals import STATE, committed_batches

__all__ = [
    "ARROW_PRIOR",
    "ARROW_STAGED",
    "PRIOR",
    "REWRITES",
    "STAGED",
    "finish_arrow_swap",
    "mark_step",
    "pending_rewrite",
    "pin_rewrite",
    "restore_arrow",
    "settle_rewrite",
    "swap_back",
    "swap_in",
    "unpin_rewrite",
]

#: ``run.json``'s key of the computations with a rewrite not yet committed by a batch
REWRITES = "rewrites"
#: the rewritten store, grafted beside the live one until the swap
STAGED = ".state.rewrite"
#: the store as the run left it, kept for ``--undo`` until a batch commits after the rewrite
PRIOR = ".state.prewrite"
#: on the Arrow mapping (under ``colstate/<C>/``): the old manifest and its store files, and
#: the rewrite's manifest until it is written into ``manifests/``
ARROW_PRIOR = ".prewrite"
ARROW_STAGED = ".rewrite.json"


def pending_rewrite(held: dict[str, Any], computation: str) -> dict[str, Any] | None:
    """``computation``'s entry under ``run.json``'s ``"rewrites"`` (``held``), or ``None``."""
    entry = (held.get(REWRITES) or {}).get(computation)
    return dict(entry) if entry else None


def pin_rewrite(root: Location, computation: str, entry: dict[str, Any]) -> None:
    """Write ``computation``'s rewrite entry into ``run.json`` (one atomic replace)."""
    update_pin(root, lambda pin: pin.setdefault(REWRITES, {}).__setitem__(computation, entry))


def mark_step(root: Location, computation: str, step: str) -> None:
    def change(pin: dict[str, Any]) -> None:
        entry = (pin.get(REWRITES) or {}).get(computation)
        if entry is not None:
            entry["step"] = step

    update_pin(root, change)


def unpin_rewrite(root: Location, computation: str) -> None:
    """Drop ``computation``'s rewrite entry (and ``"rewrites"`` once empty)."""

    def change(pin: dict[str, Any]) -> None:
        rewrites = pin.get(REWRITES) or {}
        rewrites.pop(computation, None)
        if rewrites:
            pin[REWRITES] = rewrites
        else:
            pin.pop(REWRITES, None)

    update_pin(root, change)


def swap_in(checkpoint: Location, crash: Callable[[], None] | None = None) -> None:
    """Put the staged store in place of the live one, the live one aside as the prior store
    — or, if a prior store is kept already (a rewrite stacked on a pending one), deleted: the
    prior store stays the one the run left. Each step can be redone after a kill."""
    state, staged, prior = (
        checkpoint.child(STATE),
        checkpoint.child(STAGED),
        checkpoint.child(PRIOR),
    )
    if not staged.exists():
        return  # swapped already
    if state.exists():
        if prior.exists():
            state.delete()
        else:
            state.move_to(prior)
    if crash is not None:
        crash()  # test hook: killed between the two renames
    staged.move_to(state)


def swap_back(checkpoint: Location) -> None:
    """Put the prior store back in place of the rewritten one (``--undo``); redoable."""
    state, staged, prior = (
        checkpoint.child(STATE),
        checkpoint.child(STAGED),
        checkpoint.child(PRIOR),
    )
    if prior.exists():
        if state.exists():
            state.delete()
        prior.move_to(state)
    staged.delete()


def settle_rewrite(root: Location, computation: str, checkpoint: Location, log: Any = None) -> str:
    """Bring ``computation``'s rewrite to a state a query can start on: finish an interrupted
    swap or undo, and forget a rewrite a later batch has committed (its prior store deleted).
    Returns what it found: ``""`` (no rewrite), ``"pending"`` (new store in place, the old one
    kept), ``"undone"`` or ``"committed"``. Called by every command and driver start."""
    say = log or (lambda _msg: None)
    entry = pending_rewrite(read_pin(root), computation)
    if entry is None:
        return ""
    if entry.get("mapping") == "arrow":
        files = ColumnarFiles(root.child(STATE_DIR, computation))
        return _settle(
            root,
            computation,
            checkpoint,
            entry,
            say,
            undo=lambda: restore_arrow(files, int(entry["batch"])),
            redo=lambda: finish_arrow_swap(files),
            drop=lambda: files.loc.child(ARROW_PRIOR).delete(),
        )

    def drop() -> None:
        checkpoint.child(PRIOR).delete()
        checkpoint.child(STAGED).delete()

    return _settle(
        root,
        computation,
        checkpoint,
        entry,
        say,
        undo=lambda: swap_back(checkpoint),
        redo=lambda: swap_in(checkpoint),
        drop=drop,
    )


def _settle(
    root: Location,
    computation: str,
    checkpoint: Location,
    entry: dict[str, Any],
    say: Any,
    *,
    undo: Callable[[], None],
    redo: Callable[[], None],
    drop: Callable[[], None],
) -> str:
    """:func:`settle_rewrite`'s steps, one set for either store: ``undo`` puts the prior store
    back, ``redo`` finishes the swap in, ``drop`` forgets the prior store; each is redoable."""
    step = entry.get("step")
    if step == "undoing":
        undo()
        unpin_rewrite(root, computation)
        say(f"computation {computation!r}: finished the interrupted undo of its state rewrite")
        return "undone"
    if step == "swapping":
        redo()
        mark_step(root, computation, "pending")
        say(f"computation {computation!r}: finished the interrupted swap of its rewritten state")
    committed = committed_batches(checkpoint)
    if committed and committed[-1] > int(entry["batch"]):
        drop()
        unpin_rewrite(root, computation)
        return "committed"
    return "pending"


# -- the Arrow mapping's own files (``_rewrite_arrow.py``) -------------------------------
def finish_arrow_swap(files: ColumnarFiles) -> None:
    """The staged manifest into ``manifests/`` (the rewrite's one atomic step); redoable."""
    staged = files.loc.child(ARROW_STAGED)
    text = staged.read_text()
    if text is None:
        return  # written already
    files.write_manifest(Manifest.decode(text))
    staged.delete()


def restore_arrow(files: ColumnarFiles, batch: int) -> None:
    """Put back the prior manifest of ``batch`` and its store files, then drop every later
    manifest of ``batch`` (the rewrites'); redoable."""
    prior = files.loc.child(ARROW_PRIOR)
    text = prior.child("manifest.json").read_text()
    if text is not None:
        old = Manifest.decode(text)
        for i, name in sorted(old.files.items()):
            if not files.interval_dir(i).child(name).exists():
                with prior.fs.open_input_stream(prior.child(f"i{i}", name).path) as s:
                    files.write_store(i, name, s.read())
        files.write_manifest(old)
        for n, epoch, name in files._manifest_names():
            if n == batch and epoch > old.epoch:
                files.manifests.child(name).delete()
    files.loc.child(ARROW_STAGED).delete()
    prior.delete()
