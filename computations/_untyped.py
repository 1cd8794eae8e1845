"""Resuming runs stored before a computation's state was typed (issue 37).

The built-in computations once kept their state as a plain dict under the default codec
(pickle) and tagged their timers ``"<prefix><start>"`` (``"w1000"``, ``"dip1000"``). They now
keep a dataclass and timer families (``"w:1000"``), as ``docs/concepts.md`` teaches. A run
directory holds what the old classes stored, so each computation

* reads its state with :class:`PickledBefore`: its typed codec, and pickle for state
  stored before (which it converts from the old dict);
* handles a timer under an old tag (:func:`untyped_tag`) as its family's, and in the
  first step that reads a key's state in the old form moves the key's other timers to
  their families (:func:`move_untyped_timers`), so no window ever has two timers.
"""

from __future__ import annotations

import pickle
from typing import Any

from millwheel import Computation, StateCodec


def is_pickled(data: bytes) -> bool:
    """Whether ``data`` is pickled (protocol 2 or later), not msgpack: msgpack's only value
    that starts with byte 0x80 is the empty map, one byte long.

    >>> is_pickled(pickle.dumps({}, 5)), is_pickled(b"\\x80"), is_pickled(b"\\x82\\xa1a\\x01\\xa1b\\x02")
    (True, False, False)
    """
    return len(data) > 1 and data[0] == 0x80


class PickledBefore:
    """``typed``'s encoding; state that a run stored before the state was typed (pickled by
    the default codec) is decoded as it was stored, for the computation to convert."""

    def __init__(self, typed: StateCodec) -> None:
        self.typed = typed
        self.name = f"{typed.name}, pickled before"

    def encode(self, value: Any) -> bytes:
        return self.typed.encode(value)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data) if is_pickled(data) else self.typed.decode(data)


def untyped_tag(tag: str, prefixes: tuple[str, ...]) -> tuple[str, int] | None:
    """``(prefix, start)`` of a timer tag ``"<prefix><start>"`` an older run set, else ``None``
    (a family's tag has a ``':'`` after its prefix).

    >>> untyped_tag("w1000", ("w", "x")), untyped_tag("w:1000", ("w", "x")), untyped_tag("dip-5", ("dip",))
    (('w', 1000), None, ('dip', -5))
    """
    for prefix in prefixes:
        rest = tag[len(prefix) :]
        if tag.startswith(prefix) and rest.lstrip("-").isdigit():
            return prefix, int(rest)
    return None


def move_untyped_timers(comp: Computation, families: dict[str, Any]) -> None:
    """Move the key's timers from the old tags to their families (``prefix -> self.<family>``),
    each named by its start; call it in the step that reads the key's state in the old form."""
    for timer in comp.pending_timers():
        old = untyped_tag(timer.tag, tuple(families))
        if old is not None:
            comp.delete_timer(timer.tag)
            families[old[0]].set(timer.timestamp, name=str(old[1]))
