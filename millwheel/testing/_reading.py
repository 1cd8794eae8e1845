"""The harness's reading side: what streams received, and what each key of a computation
keeps (state, timers, pending productions, dedup ids), in user types; a test's given
(:meth:`~HarnessReading.set_state`). :class:`~millwheel.testing.Harness` inherits it."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._envelope import Envelope
from millwheel._errors import HarnessError
from millwheel._record import Key, Production, Record, TimeDomain, Timer, key_problem
from millwheel._step import StepRunner, pending_productions
from millwheel._versions import stored_version
from millwheel.testing._index import MinIndex


class HarnessReading:
    """Reads the harness's streams and per-key envelopes; the harness keeps them."""

    _streams: dict[str, list[Record]]
    _envelopes: dict[str, dict[Key, bytes]]
    _lw_timers: dict[str, MinIndex]
    _wall_timers: dict[str, MinIndex]
    _metrics: dict[str, StepMetrics]
    _columnar: dict[str, Any]

    if TYPE_CHECKING:  # the harness's own

        def _runner(self, name: str) -> StepRunner: ...

        def _store(
            self,
            name: str,
            key: Key,
            env: bytes | None,
            hold: int | None,
            timers: tuple[int | None, int | None],
        ) -> None: ...

    def output(self, stream: str) -> list[Record]:
        """Every record published to ``stream``, in order (re-deliveries included)."""
        return list(self._streams.get(stream, []))

    def values(self, stream: str) -> list[Any]:
        """The values of :meth:`output`."""
        return [r.value for r in self._streams.get(stream, [])]

    def dead_letters(self) -> list[Record]:
        return self.output(DEAD_LETTER_STREAM)

    def keys(self, computation: str) -> list[Key]:
        """Keys of ``computation`` that keep anything (state, timers, pending productions, dedup ids)."""
        self._runner(computation)
        if computation in self._columnar:
            return self._columnar[computation].keys()
        return list(self._envelopes[computation])

    def _envelope(self, computation: str, key: Key) -> Envelope:
        self._runner(computation)
        return Envelope.decode(self._envelopes[computation].get(key))

    def envelope(self, computation: str, key: Key) -> Envelope:
        """Deprecated: the internal envelope of one key. Use :meth:`state`, :meth:`timers`,
        :meth:`pending_productions` and :meth:`dedup_ids`."""
        warnings.warn(
            "Harness.envelope() returns an internal type and will go; use state(), timers(), pending_productions() or dedup_ids()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._envelope(computation, key)

    def state(self, computation: str, key: Key) -> Any:
        """The decoded state of one key, or ``None`` (a columnar computation: its state rows)."""
        if computation in self._columnar:
            return self._columnar[computation].state(key)
        raw = self._envelope(computation, key).state
        return None if raw is None else self._runner(computation).codec.decode(raw)

    def state_version(self, computation: str, key: Key) -> int | None:
        """The version of the code that stored one key's state (``None``: it keeps none), as
        ``millwheel state`` shows it: state an older version stored stays of that version
        until it is set again (a columnar store: until a round touches it; ``docs/concepts.md``,
        "Schema evolution")."""
        if computation in self._columnar:
            side = self._columnar[computation]
            if side.state(key) is None:
                return None
            v = side._current().state_version  # None: a store no round wrote, the code's
            return v if v is not None else type(side.runner.computation).state_version
        return stored_version(self._envelope(computation, key).state)

    def set_state(self, computation: str, key: Key, value: Any) -> None:
        """Seed (or replace) one key's state before running, as a test's given (``None``
        clears it); its timers, pending productions and dedup ids are kept. As Spark's
        ``TwsTester.setValueState``: the value is stored with the computation's codec."""
        runner = self._runner(computation)
        if computation in self._columnar:
            return self._columnar[computation].set_state(key, value)
        why = key_problem(key)
        if why is not None:
            msg = f"set_state({computation!r}, ...): {why}"
            raise HarnessError(msg)
        env = self._envelope(computation, key)
        env.state = None if value is None else runner.codec.encode(value)
        raw = None if env.is_empty() else env.encode()
        self._store(
            computation,
            key,
            raw,
            env.hold(),
            (self._lw_timers[computation].get(key), self._wall_timers[computation].get(key)),
        )

    def dedup_ids(self, computation: str, key: Key) -> set[str]:
        """The record ids one key still remembers for exactly-once delivery (§6.1.1)."""
        if computation in self._columnar:
            return self._columnar[computation].dedup_ids(key)
        return set(self._envelope(computation, key).dedup.ids())

    def timers(self, computation: str, key: Key) -> list[Timer]:
        """Pending timers of one key, earliest first."""
        if computation in self._columnar:
            return self._columnar[computation].timers(key)
        env = self._envelope(computation, key)
        items = sorted(env.timers.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))
        return [Timer(tag, ts, TimeDomain(d)) for tag, (ts, d) in items]

    def pending_productions(self, computation: str, key: Key) -> list[Production]:
        """Strong productions checkpointed for one key and not yet acknowledged."""
        self._runner(computation)
        if computation in self._columnar:
            return [p for p in self._columnar[computation].pending() if p.record.key == key]
        return pending_productions(self._envelopes[computation].get(key))

    def metrics(self, computation: str) -> dict[str, int]:
        """Counters summed over every step of ``computation``."""
        self._runner(computation)
        return self._metrics[computation].as_dict()
