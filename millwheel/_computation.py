"""The ``Computation`` base class users subclass (MillWheel §4.1, §5.1, Fig. 7).

Override :meth:`Computation.process_record` and, if you set timers,
:meth:`Computation.process_timer`. Inside them the framework gives you, for the key being
processed: ``self.key``, ``self.state`` (get/set/clear), ``self.set_timer`` /
``self.delete_timer``, ``self.produce``, and read-only ``self.now`` (wall time) and
``self.low_watermark`` (the input low watermark). Processing is serial per key and the
framework may run keys in parallel (§4.1): keep nothing per key on ``self`` yourself.

>>> from millwheel import Computation, Record
>>> class Counter(Computation):
...     def process_record(self, record: Record) -> None:
...         self.state.set((self.state.get() or 0) + 1)
...         self.produce("counts", self.state.get())
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from millwheel._errors import ComputationError, DeclarationError
from millwheel._options import ComputationOptions
from millwheel._record import Key, Record, TimeDomain, Timer


class KeyContext(Protocol):
    """What a computation reaches for the key being processed; the per-key step implements it
    (as Beam's ``UserStateContext``: the API declares it, the runner provides it)."""

    key: Key
    state: State
    now: int
    low_watermark: int

    def set_timer(self, tag: str, timestamp: int, domain: TimeDomain) -> None: ...

    def delete_timer(self, tag: str) -> None: ...

    def pending_timers(self) -> list[Timer]: ...

    def hold_watermark(self, timestamp: int | None) -> None: ...

    def produce(
        self,
        stream: str,
        value: Any,
        timestamp: int | None,
        key: Key | None,
        once_id: str | None = None,
        once_tentative: bool = False,
    ) -> None: ...


class State:
    """One key's persistent state (§4.4): ``get``, ``set``, ``clear``.

    The value is decoded at most once per step and encoded once at its end, and only if
    ``set`` or ``clear`` was called: call ``set`` after mutating what ``get`` returned.
    """

    __slots__ = ("_codec", "_raw", "_value", "_loaded", "dirty")

    def __init__(self, codec: Any, raw: bytes | None) -> None:
        self._codec = codec
        self._raw = raw
        self._value: Any = None
        self._loaded = raw is None
        self.dirty = False

    def get(self, default: Any = None) -> Any:
        """The key's state, or ``default`` when it has none."""
        if not self._loaded:
            self._value = self._codec.decode(self._raw)
            self._loaded = True
        return default if self._value is None else self._value

    def set(self, value: Any) -> None:
        """Replace the key's state; ``None`` is the same as :meth:`clear`."""
        self._value = value
        self._loaded = True
        self.dirty = True

    def clear(self) -> None:
        """Drop the key's state."""
        self.set(None)

    def reset(self, raw: bytes | None) -> None:
        """Back to ``raw`` as stored, undecoded (a rollback to a savepoint)."""
        self._raw = raw
        self._value = None
        self._loaded = raw is None
        self.dirty = False

    def encoded(self) -> bytes | None:
        if not self.dirty:
            return self._raw
        return None if self._value is None else self._codec.encode(self._value)


class _NoKey:
    """Stands in for the per-key context outside ``process_record``/``process_timer``."""

    __slots__ = ("owner",)

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def __getattr__(self, name: str) -> Any:
        msg = f"{self.owner}: key, state, timers and produce are only available inside process_record/process_timer"
        raise ComputationError(msg)


class _StateSlot:
    """``Computation.state``, the key's persistent state (§4.4).

    User code reads ``self.state`` once or twice per record, so it costs one dict lookup:
    the step puts the key's :class:`State` in the computation's ``__dict__`` for its
    duration (this is a non-data descriptor, so the instance's entry wins). Outside a
    step there is no entry and this reaches the per-key context, which raises.
    """

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        return obj._ctx.state


class TimerFamily:
    """A family of timers with one handler, declared on the class (as Beam's ``TimerSpec``
    with ``@on_timer``; Flink's ``KeyedProcessFunction`` has one ``onTimer`` for all).

    Each timer of a family has a *name* (``""`` for a family of one): its tag is
    ``"<family>:<name>"`` (``"<family>"`` for the empty name), so families never collide
    and the handler gets the name back without parsing tags. A class that declares
    families needs no ``process_timer``: the default one calls the family's handler.

    >>> from millwheel import Computation, Record, Timer
    >>> class Sessions(Computation):
    ...     close = TimerFamily()                 # on the low watermark (the default domain)
    ...     def process_record(self, record: Record) -> None:
    ...         self.close.set(record.timestamp + 30_000, name=record.value["user"])
    ...     @close.on_fire
    ...     def closed(self, name: str, timer: Timer) -> None:
    ...         self.produce("sessions", {"user": name, "closed_at": timer.timestamp})
    >>> Sessions.close.tag("ann"), Sessions.close.name_of("close:ann")
    ('close:ann', 'ann')
    """

    def __init__(
        self, domain: TimeDomain = TimeDomain.LOW_WATERMARK, *, tag: str | None = None
    ) -> None:
        """``tag``: the family's part of its timers' tags (default: the attribute's name), to
        keep the tags of timers that runs already hold when a family is renamed."""
        if tag is not None and (type(tag) is not str or ":" in tag):
            msg = f"TimerFamily(tag={tag!r}): a family's tag is a str without ':'"
            raise DeclarationError(msg)
        self.domain = domain
        self.family = tag or ""
        self.handler: Any = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.family = self.family or name  # an attribute's name never holds ':'

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return self if obj is None else _BoundTimers(self, obj)

    def on_fire(self, fn: Any) -> Any:
        """Decorate the method ``fn(self, name, timer)`` that handles this family's timers."""
        self.handler = fn
        return fn

    def tag(self, name: str = "") -> str:
        """The tag of this family's timer ``name``."""
        if type(name) is not str:
            msg = f"timer family {self.family!r}: a timer's name must be a str, got {type(name).__name__}"
            raise ComputationError(msg)
        return f"{self.family}:{name}" if name else self.family

    def name_of(self, tag: str) -> str | None:
        """The name of the timer with ``tag`` if it belongs to this family, else ``None``."""
        if tag == self.family:
            return ""
        head, sep, rest = tag.partition(":")
        return rest if sep and head == self.family else None


class _BoundTimers:
    """A family's timers for the key being processed (``self.<family>`` inside a step)."""

    __slots__ = ("spec", "comp")

    def __init__(self, spec: TimerFamily, comp: Computation) -> None:
        self.spec = spec
        self.comp = comp

    def set(self, timestamp: int, name: str = "") -> None:
        """Set (or move) this family's timer ``name`` for the key."""
        self.comp.set_timer(self.spec.tag(name), timestamp, self.spec.domain)

    def delete(self, name: str = "") -> None:
        """Cancel this family's timer ``name``; no error if there is none."""
        self.comp.delete_timer(self.spec.tag(name))

    def pending(self) -> dict[str, Timer]:
        """This family's pending timers for the key, by name, earliest first."""
        out = {}
        for t in self.comp.pending_timers():
            name = self.spec.name_of(t.tag)
            if name is not None:
                out[name] = t
        return out


class Computation:
    """Base class of user computations. See the module docstring for the API."""

    #: the class's timer families by name (collected when the class is defined)
    _timer_families: ClassVar[dict[str, TimerFamily]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        families = {}
        for klass in reversed(cls.__mro__):
            for attr in vars(klass).values():
                if isinstance(attr, TimerFamily):
                    families[attr.family] = attr
        cls._timer_families = families

    #: default options for this computation class; ``Topology.computation(options=...)`` overrides
    options: ClassVar[ComputationOptions] = ComputationOptions()

    #: set by the framework: the computation's name in its topology
    name: str = ""

    #: the key being processed; set by the step for its duration (accessors read it directly:
    #: they run once per record)
    _ctx: KeyContext = _NoKey("Computation")  # type: ignore[assignment]

    # ---- hooks ---------------------------------------------------------------
    def setup(self) -> None:
        """Called once per instance before any record; open clients or load models here."""

    def teardown(self) -> None:
        """Called once per instance after its last record, to close what :meth:`setup` opened.

        The harness calls it from ``Harness.close()`` (and ``with Harness(...)``, and
        ``millwheel run --backend harness`` at the end) and when ``restart`` replaces an
        instance. It is best effort, as Beam's ``DoFn.teardown``: a killed process never
        calls it, and Spark ends its Python workers with ``os._exit``, so on Spark the
        worker's connections and files close with its process instead. Never keep
        anything there that a checkpoint needs.
        """

    def process_record(self, record: Record) -> None:
        """Called once per input record, serially per key (§5.1)."""
        msg = f"computation {self.name or type(self).__name__!r} must override process_record(self, record)"
        raise NotImplementedError(msg)

    def process_timer(self, timer: Timer) -> None:
        """Called when a timer fires (§4.6). Override it if you call ``set_timer``; a
        timer of a :class:`TimerFamily` goes to the family's handler."""
        families = self._timer_families
        if families:
            family = families.get(timer.tag.partition(":")[0])
            if family is not None and family.handler is not None:
                name = family.name_of(timer.tag)
                if name is not None:
                    family.handler(self, name, timer)
                    return
        msg = (
            f"computation {self.name or type(self).__name__!r} set timer {timer.tag!r} "
            "but does not override process_timer(self, timer)"
        )
        raise ComputationError(msg)

    # ---- accessors -----------------------------------------------------------
    @property
    def key(self) -> Key:
        """The key being processed (§4.2)."""
        return self._ctx.key

    state: State = _StateSlot()  # type: ignore[assignment]

    @property
    def now(self) -> int:
        """Wall time in ms, fixed for the duration of one step."""
        return self._ctx.now

    @property
    def low_watermark(self) -> int:
        """The input low watermark (§4.5): no future input record is older, barring late data."""
        return self._ctx.low_watermark

    def set_timer(
        self, tag: str, timestamp: int, domain: TimeDomain = TimeDomain.LOW_WATERMARK
    ) -> None:
        """Set (or replace: same tag) a timer for this key (§4.6, Fig. 7 ``SetTimer``).

        A low-watermark timer fires once the input low watermark reaches ``timestamp`` and
        holds this computation's low watermark at ``timestamp`` until then (§7.2). A
        wall-time timer fires once wall time reaches ``timestamp``; it holds nothing.
        """
        self._ctx.set_timer(tag, timestamp, domain)

    def delete_timer(self, tag: str) -> None:
        """Cancel this key's timer ``tag``; no error if there is none."""
        self._ctx.delete_timer(tag)

    def pending_timers(self) -> list[Timer]:
        """This key's pending timers, earliest first."""
        return self._ctx.pending_timers()

    def hold_watermark(self, timestamp: int | None) -> None:
        """Hold this computation's low watermark at ``timestamp`` for this key (§7.2), or release it (``None``).

        MillWheel counts persisted state among a computation's pending work: a window kept
        in state, to be emitted later stamped with its oldest (or newest) source record,
        must keep consumers from moving past that timestamp, or the emission arrives late.
        A low-watermark timer holds the watermark at *its* timestamp; use this when what
        you will produce is older than that. The hold is checkpointed with the key's state
        and stays until replaced or released.
        """
        self._ctx.hold_watermark(timestamp)

    def produce(
        self,
        stream: str,
        value: Any,
        timestamp: int | None = None,
        key: Key | None = None,
        *,
        once_id: str | None = None,
        once_tentative: bool = False,
    ) -> None:
        """Produce a record to ``stream`` (§5.1 ``ProduceRecord``).

        ``timestamp`` defaults to the timestamp of the record or low-watermark timer being
        processed; it should be no smaller than the source records' (§4.5). ``key`` is
        informational: each consumer extracts its own key (§4.2).

        ``once_id`` makes the production conditional (Photon §2): of all pipelines sharing
        an IdRegistry, only the first to commit ``once_id`` (e.g. a click id) produces it;
        the others drop it (``once_conflicts``). Commits are made in bulk per batch.
        ``once_tentative=True`` marks a decision that yields: it holds the id only until a
        production of the same id that is not tentative comes, which takes the id over
        (a give-up report, say, that must not stop another pipeline from joining: Photon
        registers only joined events). Tentative productions among themselves are once.
        """
        self._ctx.produce(stream, value, timestamp, key, once_id, once_tentative)
