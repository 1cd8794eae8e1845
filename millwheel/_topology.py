"""Topologies: injectors, computations and sinks wired by named streams (MillWheel §3, §4.2–4.3).

Streams are identified by name only; any computation may subscribe to any stream, and
the *consumer* gives a key extractor per input stream (§4.2, Fig. 5). A topology is
checked as it is built and again by :meth:`Topology.validate`; every message names the
piece at fault and says how to fix it.

>>> from millwheel import Computation, Topology
>>> class Echo(Computation):
...     def process_record(self, record):
...         self.produce("out", record.value)
>>> t = Topology("demo")
>>> _ = t.injector("words")
>>> _ = t.computation(Echo, inputs={"words": lambda r: r.value}, outputs=["out"])
>>> t.validate().name
'demo'
>>> t.computation(Echo, inputs={"wrods": lambda r: r.value}, outputs=["out2"], name="Echo2").name
'Echo2'
>>> t.validate()
Traceback (most recent call last):
...
millwheel._errors.TopologyError: topology 'demo' is not valid:
  - computation 'Echo2' reads stream 'wrods', which nothing produces (streams: dead_letters, out, out2, words); did you mean 'words'?
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from millwheel._columnar import ColumnarComputation, is_columnar
from millwheel._computation import Computation
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._errors import TopologyError
from millwheel._fields import StreamFields
from millwheel._initial_state import InitialState
from millwheel._options import ComputationOptions, LateAction
from millwheel._record import Key, Record
from millwheel._sources import Source

KeyExtractor = Callable[[Record], Key]

#: a name starts with a letter: names become directories of the run, and Spark's file
#: sources skip paths that start with ``_`` or ``.`` (a computation named ``_Tally`` would
#: publish files nobody reads)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        msg = f"{kind} name {name!r} is not valid: use letters, digits, '_', '.', '-', starting with a letter"
        if isinstance(name, str) and name[:1] in "_.":
            msg += " (names become directories of the run, and Spark skips those starting with '_' or '.'); pass name=..."
        raise TopologyError(msg)


def record_key(record: Record) -> Key:
    """The default key extractor: the key the record already carries."""
    return record.key  # type: ignore[return-value]


def check_mapping(name: str, cls: type, mapping: object) -> None:
    """The one rule of kind x mapping, checked when the topology is built and again when a
    plan is chosen (``runtime/plans/_choice.py``): the Arrow mapping runs columnar
    computations only (:class:`TopologyError` otherwise)."""
    if mapping == "arrow" and not is_columnar(cls):
        msg = (
            f"computation {name!r} runs on the Arrow mapping (ComputationOptions(mapping='arrow')), but it "
            f"is for columnar computations (ColumnarComputation); {cls.__name__} is not one"
        )
        raise TopologyError(msg)


@dataclass(frozen=True)
class InjectorSpec:
    """An injector: publishes records to ``stream`` and an injector low watermark (§5.2)."""

    name: str
    stream: str
    source: Source | None = None


@dataclass(frozen=True)
class ComputationSpec:
    """A computation node: its class, input streams with key extractors, output streams."""

    name: str
    cls: type[Computation]
    inputs: Mapping[str, KeyExtractor]
    outputs: tuple[str, ...]
    options: ComputationOptions
    params: Mapping[str, Any] = field(default_factory=dict)

    def instantiate(self) -> Computation:
        """A fresh instance of the user's class, named, with ``setup()`` called."""
        try:
            comp = self.cls(**self.params)
        except TypeError as exc:
            msg = f"computation {self.name!r}: cannot construct {self.cls.__name__}(**{dict(self.params)!r}): {exc}"
            raise TopologyError(msg) from exc
        comp.name = self.name
        comp.setup()
        return comp

    @property
    def handles_timers(self) -> bool:
        """Whether the class can process a timer at all: it overrides ``process_timer`` (or,
        columnar, ``process_timers``) or declares a :class:`~millwheel.TimerFamily`. One that
        cannot needs no batch only to fire timers (``docs/runtime.md``, "No-data batches").

        >>> from millwheel import Computation
        >>> class Tally(Computation):
        ...     def process_record(self, record): ...
        >>> ComputationSpec("Tally", Tally, {}, (), ComputationOptions()).handles_timers
        False
        """
        if getattr(self.cls, "_timer_families", None):
            return True
        if is_columnar(self.cls):
            return self.cls.process_timers is not ColumnarComputation.process_timers  # type: ignore[attr-defined]
        return self.cls.process_timer is not Computation.process_timer

    @property
    def all_outputs(self) -> tuple[str, ...]:
        """Declared outputs plus the late stream, if the late policy names one."""
        late = self.options.late
        if (
            late.action is LateAction.TO_STREAM
            and late.stream is not None
            and late.stream not in self.outputs
        ):
            return (*self.outputs, late.stream)
        return self.outputs


@dataclass(frozen=True)
class SinkSpec:
    """A sink: sends a stream out of the system (``target`` is backend-specific)."""

    name: str
    stream: str
    target: Any = None
    #: a :class:`~millwheel.SparkSink`: the stream goes out through Spark (``runtime/_sparksink.py``)
    spark: Any = None


class Topology:
    """A named graph of injectors, computations and sinks. See the module docstring."""

    def __init__(self, name: str, *, spark_conf: Mapping[str, str] | None = None) -> None:
        _check_name("topology", name)
        self.name = name
        #: Spark settings this topology needs (``spark.jars.packages`` for a connector, ...);
        #: ``millwheel run --conf k=v`` overrides them
        self.spark_conf: dict[str, str] = {str(k): str(v) for k, v in (spark_conf or {}).items()}
        self.injectors: dict[str, InjectorSpec] = {}
        self.computations: dict[str, ComputationSpec] = {}
        self.sinks: dict[str, SinkSpec] = {}
        #: streams that declare their fields (:meth:`stream`)
        self.fields: dict[str, StreamFields] = {}
        #: each computation's initial state, checked (``_initial_state.py``): kept beside its
        #: spec, which workers unpickle, so a large or Spark-bound source never travels with it
        self.initial_states: dict[str, InitialState] = {}

    # ---- building ------------------------------------------------------------------
    def _check_unique(self, name: str) -> None:
        for kind, table in (
            ("injector", self.injectors),
            ("computation", self.computations),
            ("sink", self.sinks),
        ):
            if name in table:
                msg = f"topology {self.name!r} already has a {kind} named {name!r}; pass a unique name=..."
                raise TopologyError(msg)

    def stream(self, name: str, *, fields: Mapping[str, type]) -> StreamFields:
        """Declare the fields of stream ``name`` (``{"query": str, "ms": float}``: str, int,
        float, bool, bytes; ``None`` allowed in any): values that are exactly such a dict
        travel as typed columns, the others pickled as before; a reader sees the same
        values either way (``millwheel/_fields.py``, docs/concepts.md "Declared fields")."""
        _check_name("stream", name)
        if name == DEAD_LETTER_STREAM:
            msg = f"stream {name!r} carries DeadLetter values: it cannot declare fields"
            raise TopologyError(msg)
        if name in self.fields:
            msg = f"topology {self.name!r} declares the fields of stream {name!r} twice"
            raise TopologyError(msg)
        self.fields[name] = StreamFields.of(fields, name)
        return self.fields[name]

    def injector(
        self, name: str, source: Source | None = None, *, stream: str | None = None
    ) -> InjectorSpec:
        """Add an injector publishing to ``stream`` (default: a stream named like the injector)."""
        _check_name("injector", name)
        stream = name if stream is None else stream
        _check_name(f"injector {name!r} stream", stream)
        self._check_unique(name)
        if source is not None and not isinstance(source, Source):
            msg = f"injector {name!r}: source must be a millwheel Source (e.g. SampleSource), got {type(source).__name__}"
            raise TopologyError(msg)
        spec = InjectorSpec(name, stream, source)
        self.injectors[name] = spec
        return spec

    def computation(
        self,
        cls: type[Computation],
        *,
        inputs: Mapping[str, KeyExtractor | None] | Sequence[str],
        outputs: Sequence[str] = (),
        name: str | None = None,
        options: ComputationOptions | None = None,
        params: Mapping[str, Any] | None = None,
        initial_state: Any = None,
    ) -> ComputationSpec:
        """Add a computation.

        ``inputs`` maps each input stream to the key extractor this computation applies to
        it (§4.2); a list of stream names, or ``None`` as extractor, keeps the record's key.
        An extractor gets the record as produced, with ``stream`` set to the input stream;
        it should be a pure function of the record (the Spark runtime applies it where the
        record is written, once for every consumer, and again in the consumer only for a
        record it failed on). ``params`` are keyword arguments for the class's constructor.
        ``initial_state``: the per-key state it starts from (an iterable of ``(key, state[,
        timers])``, a DataFrame, a Parquet or JSON-lines path), loaded through its own codec
        before its first batch (``_initial_state.py``; docs/concepts.md, "Bootstrap").
        """
        if not (isinstance(cls, type) and issubclass(cls, Computation)):
            msg = f"Topology.computation expects a Computation subclass, got {cls!r}"
            raise TopologyError(msg)
        name = cls.__name__ if name is None else name
        _check_name("computation", name)
        self._check_unique(name)
        if cls.process_record is Computation.process_record:
            msg = f"computation {name!r}: {cls.__name__} must override process_record(self, record)"
            raise TopologyError(msg)
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, (Mapping, Sequence)):
            msg = f"computation {name!r}: inputs must be a dict {{stream: key_extractor}} or a list of streams, got {inputs!r}"
            raise TopologyError(msg)
        pairs = list(inputs.items()) if isinstance(inputs, Mapping) else [(s, None) for s in inputs]
        if not pairs:
            msg = f"computation {name!r} has no input streams; give inputs={{'stream': key_extractor}}"
            raise TopologyError(msg)
        checked: dict[str, KeyExtractor] = {}
        for stream, extractor in pairs:
            _check_name(f"computation {name!r} input stream", stream)
            checked[stream] = self._check_extractor(name, stream, extractor)
        if isinstance(outputs, str):
            msg = f"computation {name!r}: outputs must be a list of stream names, got the string {outputs!r}; write outputs=[{outputs!r}]"
            raise TopologyError(msg)
        for stream in outputs:
            _check_name(f"computation {name!r} output stream", stream)
        if len(set(outputs)) != len(outputs):
            msg = f"computation {name!r} lists an output stream twice: {list(outputs)}"
            raise TopologyError(msg)
        opts = options if options is not None else cls.options
        if not isinstance(opts, ComputationOptions):
            msg = f"computation {name!r}: options must be a ComputationOptions, got {type(opts).__name__}"
            raise TopologyError(msg)
        check_mapping(name, cls, opts.mapping)
        if params is not None and not isinstance(params, Mapping):
            msg = f"computation {name!r}: params must be a dict of constructor keyword arguments"
            raise TopologyError(msg)
        params = dict(params or {})
        try:
            inspect.signature(cls).bind(**params)
        except TypeError as exc:
            msg = f"computation {name!r}: {cls.__name__}(**params) does not fit its constructor: {exc}"
            raise TopologyError(msg) from exc
        initial = (
            None
            if initial_state is None
            else InitialState(name, initial_state, columnar=is_columnar(cls))
        )
        spec = ComputationSpec(name, cls, checked, tuple(outputs), opts, params)
        self.computations[name] = spec
        if initial is not None:
            self.initial_states[name] = initial
        return spec

    @staticmethod
    def _check_extractor(name: str, stream: str, extractor: KeyExtractor | None) -> KeyExtractor:
        if extractor is None:
            return record_key
        if not callable(extractor):
            msg = f"computation {name!r}: key extractor for stream {stream!r} must be a function of the record, got {extractor!r}"
            raise TopologyError(msg)
        try:
            inspect.signature(extractor).bind(None)
        except TypeError:
            msg = (
                f"computation {name!r}: key extractor for stream {stream!r} must take exactly one "
                f"argument (the record), e.g. lambda r: r.value['query']; got {getattr(extractor, '__name__', extractor)!r}"
            )
            raise TopologyError(msg) from None
        except ValueError:
            pass  # builtins without a signature: trust them
        return extractor

    def sink(
        self, stream: str, target: Any = None, *, name: str | None = None, spark_sink: Any = None
    ) -> SinkSpec:
        """Send ``stream`` out of the system to ``target`` (files, backend-specific) or
        through Spark to ``spark_sink`` (a :class:`~millwheel.SparkSink`: Kafka, a table,
        a ``foreach_batch`` writer)."""
        _check_name("sink stream", stream)
        name = f"sink.{stream}" if name is None else name
        self._check_unique(name)
        from millwheel._sparkio import SparkSink

        if spark_sink is not None and not isinstance(spark_sink, SparkSink):
            msg = f"sink {name!r}: spark_sink must be a millwheel.SparkSink(format=... or foreach_batch=...), got {type(spark_sink).__name__}"
            raise TopologyError(msg)
        if spark_sink is not None and target is not None:
            msg = f"sink {name!r}: give a target or a spark_sink, not both (add a second sink with name=...)"
            raise TopologyError(msg)
        spec = SinkSpec(name, stream, target, spark_sink)
        self.sinks[name] = spec
        return spec

    # ---- reading -------------------------------------------------------------------
    def producers(self, stream: str) -> list[str]:
        """Names of the injectors and computations that publish ``stream``."""
        out = [i.name for i in self.injectors.values() if i.stream == stream]
        out += [c.name for c in self.computations.values() if stream in c.all_outputs]
        if stream == DEAD_LETTER_STREAM:
            # every injector dead-letters the records it cannot send (``_delivery.record_problem``),
            # every computation the records and timers it cannot process
            out += [i.name for i in self.injectors.values() if i.name not in out]
            out += [c.name for c in self.computations.values() if c.name not in out]
        return out

    def consumers(self, stream: str) -> list[ComputationSpec]:
        return [c for c in self.computations.values() if stream in c.inputs]

    def streams(self) -> list[str]:
        names = {i.stream for i in self.injectors.values()}
        for c in self.computations.values():
            names.update(c.all_outputs)
            names.update(c.inputs)
        names.add(DEAD_LETTER_STREAM)
        return sorted(names)

    def upstream(self, name: str) -> list[str]:
        """The injectors and computations whose low watermarks bound ``name``'s (§4.5's "C outputs to A").

        Every computation may produce dead letters, so a computation reading
        ``dead_letters`` is downstream of all the others — except of the other readers of
        ``dead_letters``: two such readers would otherwise wait for each other. Dead
        letters are never late (``millwheel/_delivery.py``), so one a reader makes still
        reaches the other readers whatever their watermarks.
        """
        spec = self.computations[name]
        seen: list[str] = []
        for stream in spec.inputs:
            for p in self.producers(stream):
                if p in seen or p == name:
                    continue
                if (
                    stream == DEAD_LETTER_STREAM
                    and p in self.computations
                    and DEAD_LETTER_STREAM in self.computations[p].inputs
                ):
                    continue
                seen.append(p)
        return seen

    def order(self) -> list[str]:
        """Computation names in topological order (upstream first)."""
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(n: str, path: list[str]) -> None:
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cycle = " -> ".join(path[path.index(n) :] + [n])
                msg = f"topology {self.name!r} has a cycle ({cycle}); low watermarks need an acyclic graph (§4.5): break it with an injector"
                raise TopologyError(msg)
            state[n] = 1
            for u in self.upstream(n):
                if u in self.computations:
                    visit(u, [*path, n])
            state[n] = 2
            order.append(n)

        for n in self.computations:
            visit(n, [])
        return order

    # ---- validation ----------------------------------------------------------------
    def validate(self) -> Topology:
        """Check the whole graph; raise one :class:`TopologyError` listing every problem."""
        problems: list[str] = []
        streams = self.streams()
        produced = {s for s in streams if self.producers(s)}
        for c in self.computations.values():
            for stream in c.inputs:
                if stream not in produced:
                    problems.append(
                        f"computation {c.name!r} reads stream {stream!r}, which nothing produces"
                        + _hint(stream, produced)
                    )
            if c.name in c.inputs or any(s in c.all_outputs for s in c.inputs):
                problems.append(
                    f"computation {c.name!r} reads a stream it produces; low watermarks need an acyclic graph (§4.5)"
                )
            problems.extend(_unhandled_families(c))
        for stream in self.fields:
            if stream not in produced:
                problems.append(
                    f"stream {stream!r} declares fields, but nothing produces it"
                    + _hint(stream, produced)
                )
        for s in self.sinks.values():
            if s.stream not in produced:
                problems.append(
                    f"sink {s.name!r} reads stream {s.stream!r}, which nothing produces"
                    + _hint(s.stream, produced)
                )
        if not problems:
            try:
                self.order()
            except TopologyError as exc:
                problems.append(str(exc))
        if problems:
            msg = f"topology {self.name!r} is not valid:\n" + "\n".join(
                f"  - {p}" for p in problems
            )
            raise TopologyError(msg)
        return self


def _unhandled_families(spec: ComputationSpec) -> list[str]:
    """A :class:`~millwheel.TimerFamily` without an ``@<family>.on_fire`` handler, on a class
    that does not override ``process_timer`` either: its timers could be set, and would
    fail only when they fire."""
    families = getattr(spec.cls, "_timer_families", None) or {}
    if not families or spec.cls.process_timer is not Computation.process_timer:
        return []
    return [
        f"computation {spec.name!r}: timer family {family.family!r} of {spec.cls.__name__} has no "
        f"handler; decorate the method that handles its timers with @{_attr_of(spec.cls, family)}.on_fire "
        "(a method (self, name, timer))"
        for family in families.values()
        if family.handler is None
    ]


def _attr_of(cls: type, family: Any) -> str:
    """The attribute name a family is declared under (its tag may differ: ``tag=...``)."""
    for klass in cls.__mro__:
        for attr, value in vars(klass).items():
            if value is family:
                return attr
    return family.family


def _hint(stream: str, known: set[str]) -> str:
    listing = ", ".join(sorted(known)) or "none"
    close = difflib.get_close_matches(stream, sorted(known), n=1)
    suffix = (
        f"; did you mean {close[0]!r}?"
        if close
        else "; add an injector or a computation with it in outputs=[...]"
    )
    return f" (streams: {listing}){suffix}"
