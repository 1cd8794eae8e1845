"""What one :meth:`Harness.run` published: its records per stream, read as the harness reads.

The harness keeps every stream's records from its start (``Harness.values``); a test that
checks one step of a scenario wants only what that step brought. ``run()`` returns a
:class:`RunResult` of what was published since the previous ``run()`` returned (or the
harness was built): the records ``inject`` published before it, the computations'
productions in it, and the dead letters of both, in the order they were published.

>>> from millwheel import Computation
>>> from millwheel.testing import Harness
>>> class Echo(Computation):
...     def process_record(self, record):
...         self.produce("echoes", record.value)
>>> h = Harness.for_computation(Echo, inputs={"words": lambda r: r.value}, outputs=["echoes"])
>>> h.inject("words", [h.record("a", 1_000)]); h.run().values("echoes")
['a']
>>> h.inject("words", [h.record("b", 2_000)]); h.run()
RunResult(echoes=1, words=1)
>>> h.values("echoes")                          # the harness keeps them all
['a', 'b']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._record import Record


@dataclass(frozen=True)
class RunResult:
    """The records published by one :meth:`~millwheel.testing.Harness.run` (see the module
    docstring), per stream; read them as from the harness: :meth:`output`, :meth:`values`,
    :meth:`dead_letters`. A stream with nothing published reads as empty."""

    #: stream -> the records published to it, in order (re-deliveries included)
    records: Mapping[str, Sequence[Record]]

    def output(self, stream: str) -> list[Record]:
        """The records published to ``stream``, in order (re-deliveries included)."""
        return list(self.records.get(stream, ()))

    def values(self, stream: str) -> list[Any]:
        """The values of :meth:`output`."""
        return [r.value for r in self.records.get(stream, ())]

    def dead_letters(self) -> list[Record]:
        """The dead letters published (their values are :class:`~millwheel.DeadLetter`)."""
        return self.output(DEAD_LETTER_STREAM)

    def streams(self) -> list[str]:
        """The streams with anything published, sorted."""
        return sorted(s for s, recs in self.records.items() if recs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={len(self.records[s])}" for s in self.streams())
        return f"RunResult({counts})"


def since(streams: Mapping[str, Sequence[Record]], marks: Mapping[str, int]) -> RunResult:
    """What ``streams`` gained since ``marks`` (each stream's length then)."""
    return RunResult(
        {
            s: tuple(recs[marks.get(s, 0) :])
            for s, recs in streams.items()
            if len(recs) > marks.get(s, 0)
        }
    )


def marks_of(streams: Mapping[str, Sequence[Record]]) -> dict[str, int]:
    """Each stream's length now: where the next :func:`since` starts."""
    return {s: len(recs) for s, recs in streams.items()}
