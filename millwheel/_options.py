"""Per-computation options: exactly-once, strong productions, late records (MillWheel §4.5, §6.1).

Options are frozen; set them on the class or pass them to ``Topology.computation``::

    class WindowCounter(Computation):
        options = ComputationOptions(late=LatePolicy.to_stream("late_queries"))

>>> ComputationOptions().exactly_once, ComputationOptions().strong_productions
(True, True)
>>> LatePolicy.to_stream("late").stream
'late'
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from millwheel._codec import PickleCodec, StateCodec
from millwheel._errors import TopologyError


class LateAction(enum.Enum):
    """What to do with a record behind the low watermark (§4.5, §5.2)."""

    DROP = "drop"
    PROCESS = "process"
    TO_STREAM = "to_stream"


@dataclass(frozen=True, slots=True)
class LatePolicy:
    """The late-record policy. Late records are always counted, whatever the action.

    * ``LatePolicy.drop()`` — discard and count (what Zeitgeist does, §4.5);
    * ``LatePolicy.process()`` — process anyway (e.g. retroactively correct an aggregate);
    * ``LatePolicy.to_stream(name)`` — produce the record unchanged to stream ``name``.
    """

    action: LateAction = LateAction.DROP
    stream: str | None = None

    def __post_init__(self) -> None:
        if (self.action is LateAction.TO_STREAM) != (self.stream is not None):
            msg = "LatePolicy: a stream name is required with TO_STREAM and only with it; use LatePolicy.to_stream('name')"
            raise TopologyError(msg)

    @classmethod
    def drop(cls) -> LatePolicy:
        return cls(LateAction.DROP)

    @classmethod
    def process(cls) -> LatePolicy:
        return cls(LateAction.PROCESS)

    @classmethod
    def to_stream(cls, stream: str) -> LatePolicy:
        return cls(LateAction.TO_STREAM, stream)


class ErrorPolicy(enum.Enum):
    """What to do when ``process_record`` or ``process_timer`` raises."""

    #: roll the key back to before the failing record, send it to the dead-letter stream, go on
    DEAD_LETTER = "dead_letter"
    #: let the exception propagate (stops the computation)
    RAISE = "raise"


@dataclass(frozen=True, slots=True)
class DedupOptions:
    """Exactly-once bookkeeping (§6.1.1).

    A record id is kept while ``record.timestamp >= low_watermark - slack_ms``. Once the
    low watermark has passed a timestamp no internal sender can still be retrying a record
    of that age (pending deliveries hold the watermark, §4.5), so only late injectors can
    re-send it: ``slack_ms`` is the allowance for them ("a few hours" in MillWheel).
    Ids are collected in steps of ``gc_interval_ms`` of watermark progress when a key is
    stepped, and from a key that keeps no state even when it gets nothing more: it is woken
    once the watermark passes its oldest ids by ``slack_ms + gc_interval_ms`` (a wake-up
    that holds no watermark), and forgotten if it kept nothing else. So a key seen once is
    not kept for ever. A key with state keeps the ids of its last records until its next
    step; a columnar computation collects every key's due ids in each call.

    The Bloom filter is the fast path: a "no" skips the exact id list, a "maybe" always
    falls back to it, so a false positive costs time and never drops a record.
    ``bloom_capacity=None`` sizes the filter to the ids kept and grows it; a number fixes it.
    """

    slack_ms: int = 10 * 60_000
    gc_interval_ms: int = 60_000
    bloom_fpr: float = 0.01
    bloom_capacity: int | None = None

    def __post_init__(self) -> None:
        if self.slack_ms < 0 or self.gc_interval_ms < 0:
            msg = f"DedupOptions: slack_ms and gc_interval_ms must be >= 0, got {self.slack_ms}, {self.gc_interval_ms}"
            raise TopologyError(msg)
        if not 0.0 < self.bloom_fpr < 1.0:
            msg = f"DedupOptions: bloom_fpr must be in (0, 1), got {self.bloom_fpr}"
            raise TopologyError(msg)
        if self.bloom_capacity is not None and self.bloom_capacity < 1:
            msg = f"DedupOptions: bloom_capacity must be >= 1 or None, got {self.bloom_capacity}"
            raise TopologyError(msg)


class Mapping(enum.StrEnum):
    """How the Spark runtime maps a computation onto Spark (``ComputationOptions.mapping``,
    ``docs/runtime.md``, "Plans"). The strings ``"default"`` / ``"arrow"`` are accepted too."""

    #: ``applyInPandasWithState`` (or ``transformWithStateInPandas``) over key intervals
    DEFAULT = "default"
    #: the opt-in mapping of columnar computations: ``foreachBatch`` → ``repartition`` →
    #: ``mapInArrow``, state in versioned files
    ARROW = "arrow"

    def __repr__(self) -> str:
        # as the string: messages name the value as a user writes it (``mapping='arrow'``)
        return repr(self.value)

    @classmethod
    def parse(cls, value: object) -> Mapping:
        """``value`` as a :class:`Mapping` (a member or its string); :class:`TopologyError` otherwise."""
        try:
            return cls(value)  # type: ignore[arg-type]
        except ValueError:
            msg = f"ComputationOptions.mapping must be one of {', '.join(map(repr, MAPPINGS))} (or a Mapping), got {value!r}"
            raise TopologyError(msg) from None


#: ``ComputationOptions.mapping`` values, as strings
MAPPINGS = tuple(m.value for m in Mapping)


@dataclass(frozen=True, slots=True)
class ComputationOptions:
    """Per-computation guarantees and policies.

    * ``exactly_once`` — deduplicate input by record id (§6.1.1); off skips the pass.
    * ``strong_productions`` — checkpoint productions with the state before delivery
      (§6.1.2); off sends them optimistically before the checkpoint (weak, §6.1.3).
    * ``late`` — the :class:`LatePolicy`.
    * ``on_error`` — the :class:`ErrorPolicy` for exceptions in user code.
    * ``state_codec`` — how state becomes bytes (§4.4).
    * ``max_timer_fires_per_step`` — bound on timers fired for one key in one step, so a
      timer that keeps re-arming itself in the past cannot spin forever; the rest fire next step.
    * ``mapping`` — how the Spark runtime runs a columnar computation (``docs/runtime.md``,
      "Plans"): :attr:`Mapping.DEFAULT` (``applyInPandasWithState`` over key intervals) or
      :attr:`Mapping.ARROW` (the opt-in ``foreachBatch`` → ``repartition`` → ``mapInArrow``
      mapping, state in versioned files); the strings ``"default"`` / ``"arrow"`` are taken
      too and read back as the member. Fixed for the life of a run directory; the harness
      ignores it.
    """

    exactly_once: bool = True
    strong_productions: bool = True
    late: LatePolicy = field(default_factory=LatePolicy.drop)
    on_error: ErrorPolicy = ErrorPolicy.DEAD_LETTER
    state_codec: StateCodec = field(default_factory=PickleCodec)
    dedup: DedupOptions = field(default_factory=DedupOptions)
    max_timer_fires_per_step: int = 10_000
    #: a :class:`Mapping` once made (a string given is read as its member)
    mapping: Mapping | str = Mapping.DEFAULT

    def __post_init__(self) -> None:
        object.__setattr__(self, "mapping", Mapping.parse(self.mapping))
        if not isinstance(self.late, LatePolicy):
            msg = f"ComputationOptions.late must be a LatePolicy (e.g. LatePolicy.drop()), got {self.late!r}"
            raise TopologyError(msg)
        if not isinstance(self.on_error, ErrorPolicy):
            msg = f"ComputationOptions.on_error must be an ErrorPolicy, got {self.on_error!r}"
            raise TopologyError(msg)
        if self.max_timer_fires_per_step < 1:
            msg = "ComputationOptions.max_timer_fires_per_step must be >= 1"
            raise TopologyError(msg)
