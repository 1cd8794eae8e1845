"""The in-memory harness: run a computation or a whole topology through the real per-key step.

The test drives time: it injects records, advances injector low watermarks and wall
time (never backwards), and runs the topology until nothing is left to do. It reads
productions per stream (all of them, or those of one ``run()``: :class:`RunResult`), state
and pending timers per key, low watermarks and counters.
Envelopes are stored encoded, exactly as the Spark runtime stores them.

Low watermarks follow MillWheel §4.5: the low watermark of computation A is
``min(oldest work of A, low watermark of every C that outputs to A)``, where A's oldest
work is its undelivered input, its pending low-watermark timers and its pending
productions; injectors seed the recursion. Published values never go back.

A windowed counter, tested end to end::

    >>> from millwheel import Computation, Record
    >>> from millwheel.testing import Harness
    >>> class WindowCounter(Computation):
    ...     def process_record(self, record):
    ...         bucket = record.timestamp // 1_000 * 1_000
    ...         counts = self.state.get({})
    ...         counts[bucket] = counts.get(bucket, 0) + 1
    ...         self.state.set(counts)
    ...         self.set_timer(f"w{bucket}", bucket + 1_000)
    ...     def process_timer(self, timer):
    ...         counts = self.state.get()
    ...         bucket = timer.timestamp - 1_000
    ...         self.produce("window_counts", (bucket, counts.pop(bucket)))
    ...         self.state.set(counts)
    >>> h = Harness.for_computation(WindowCounter, inputs={"queries": lambda r: r.value}, outputs=["window_counts"])
    >>> h.inject("queries", [Record(None, "cats", 1_100, "r1"), Record(None, "cats", 1_900, "r2")])
    >>> h.run().values("window_counts")    # the window is not complete yet
    []
    >>> h.timers("WindowCounter", "cats")
    [Timer(tag='w1000', timestamp=2000, domain=<TimeDomain.LOW_WATERMARK: 0>)]
    >>> h.low_watermark("WindowCounter")   # held back by the pending timer... and the injector
    -9223372036854775808
    >>> h.advance_watermark("queries", 2_000)
    >>> h.run()                            # what this run published, per stream
    RunResult(window_counts=1)
    >>> h.values("window_counts")          # every value the stream ever got
    [(1000, 2)]
    >>> h.advance_watermark("queries", 1_500)
    Traceback (most recent call last):
    ...
    millwheel._errors.HarnessError: injector 'queries' low watermark cannot go back from 2000 to 1500
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from millwheel._codec import decode_value
from millwheel._computation import Computation
from millwheel._counters import StepMetrics
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import (
    KeyOutcome,
    commit_once,
    count_keying,
    invalid_record,
    key_record,
    low_watermark,
    record_problem,
    run_key,
    timers_due,
)
from millwheel._errors import HarnessError
from millwheel._identity import batch_life
from millwheel._once import MemoryOnceRegistry, OnceRegistry, new_epoch, pipeline_id
from millwheel._options import ComputationOptions, ErrorPolicy
from millwheel._record import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    Key,
    Record,
)
from millwheel._step import StepRunner, acknowledge, pending_productions
from millwheel._topology import KeyExtractor, Topology
from millwheel.testing._columnar import columnar_sides
from millwheel.testing._index import MinIndex
from millwheel.testing._initial import load_initial
from millwheel.testing._reading import HarnessReading
from millwheel.testing._result import RunResult, marks_of, since
from millwheel.testing._rounds import Crash, _Outgoing, _Queued


class Harness(HarnessReading):
    """Runs a :class:`~millwheel.Topology` in memory. See the module docstring."""

    def __init__(
        self,
        topology: Topology,
        *,
        wall_time: int = 0,
        raise_errors: bool = True,
        registry: OnceRegistry | None = None,
        pipeline: str = "harness",
    ) -> None:
        """``registry`` and ``pipeline``: the IdRegistry that ``produce(..., once_id=...)``
        commits to (default: a fresh in-memory one) and this pipeline's name; two harnesses
        sharing a registry under different names are two pipelines (Photon §2)."""
        self.topology = topology.validate()
        self.registry: OnceRegistry = MemoryOnceRegistry() if registry is None else registry
        self.pipeline = pipeline
        #: this harness's identity in once-tokens: its name and an epoch of its own, so two
        #: harnesses under one name are two pipelines whose commits conflict (Photon §2)
        self.pipeline_id = pipeline_id(pipeline, new_epoch())
        self._now = wall_time
        self._order = topology.order()
        self._runners: dict[str, StepRunner] = {}
        for name in self._order:
            spec = topology.computations[name]
            opts = spec.options
            if raise_errors and opts.on_error is not ErrorPolicy.RAISE:
                opts = _with(opts, on_error=ErrorPolicy.RAISE)
            self._runners[name] = StepRunner(
                spec.instantiate(), name=name, outputs=spec.all_outputs, options=opts
            )
        self._injector_wm: dict[str, int] = {n: MIN_TIMESTAMP for n in topology.injectors}
        self._published: dict[str, int] = {n: MIN_TIMESTAMP for n in topology.computations}
        self._queues: dict[str, list[_Queued]] = {n: [] for n in topology.computations}
        self._envelopes: dict[str, dict[Key, bytes]] = {n: {} for n in topology.computations}
        self._holds: dict[str, MinIndex] = {n: MinIndex() for n in topology.computations}
        #: each key's next timer per time domain, indexed (a round looks at due keys only)
        self._lw_timers: dict[str, MinIndex] = {n: MinIndex() for n in topology.computations}
        self._wall_timers: dict[str, MinIndex] = {n: MinIndex() for n in topology.computations}
        #: keys with a timer -> when they got one: due keys fire in that order
        self._timer_order: dict[str, dict[Key, int]] = {n: {} for n in topology.computations}
        self._timer_seq = itertools.count()
        self._outbox: dict[str, list[_Outgoing]] = {n: [] for n in topology.computations}
        self._streams: dict[str, list[Record]] = defaultdict(list)
        #: each stream's length when the previous ``run()`` returned (``_result.since``)
        self._marks: dict[str, int] = {}
        self._metrics: dict[str, StepMetrics] = {n: StepMetrics() for n in topology.computations}
        self._injected = 0
        #: rounds each computation committed: a key's first production in a round starts the
        #: life of its number (``millwheel/_identity.py``), which a crashed round's replay reproduces
        self._rounds: dict[str, int] = dict.fromkeys(topology.computations, 0)
        self._closed = False
        #: columnar computations: their store and rounds, ``testing/_columnar.py``
        self._columnar = columnar_sides(self)
        for name, initial in topology.initial_states.items():  # ``testing/_initial.py``
            load_initial(self, name, initial)

    @classmethod
    def for_computation(
        cls,
        computation: type[Computation],
        *,
        inputs: Mapping[str, KeyExtractor | None] | Sequence[str],
        outputs: Sequence[str] = (),
        options: ComputationOptions | None = None,
        params: Mapping[str, Any] | None = None,
        name: str | None = None,
        wall_time: int = 0,
        raise_errors: bool = True,
        registry: OnceRegistry | None = None,
        pipeline: str = "harness",
        fields: Mapping[str, Mapping[str, type]] | None = None,
        initial_state: Any = None,
    ) -> Harness:
        """A harness around one computation, with an injector per input stream (named like
        it); ``fields`` declares streams' fields (``Topology.stream``); ``initial_state``: the
        state it starts from (``Topology.computation``)."""
        topo = Topology(f"test_{name or computation.__name__}")
        for stream in inputs:
            topo.injector(stream)
        for stream, declared in (fields or {}).items():
            topo.stream(stream, fields=declared)
        topo.computation(
            computation,
            inputs=inputs,
            outputs=outputs,
            options=options,
            params=params,
            name=name,
            initial_state=initial_state,
        )
        return cls(
            topo,
            wall_time=wall_time,
            raise_errors=raise_errors,
            registry=registry,
            pipeline=pipeline,
        )

    # ---- driving ---------------------------------------------------------------------
    def _injector(self, name: str) -> str:
        if name in self.topology.injectors:
            return name
        for inj in self.topology.injectors.values():
            if inj.stream == name:
                return inj.name
        known = ", ".join(sorted(self.topology.injectors)) or "none"
        msg = f"no injector or injected stream named {name!r} (injectors: {known})"
        raise HarnessError(msg)

    def inject(self, injector: str, records: Iterable[Record]) -> None:
        """Deliver ``records`` from an injector (or its stream's name) to every consumer.

        A record whose id or timestamp is invalid goes to ``dead_letters`` with the reason,
        as it would at a Spark injector; anything that is not a :class:`Record` raises.
        """
        inj = self.topology.injectors[self._injector(injector)]
        for rec in records:
            if not isinstance(rec, Record):
                msg = f"inject({injector!r}) takes Record objects, got {type(rec).__name__}; use Harness.record(...) to build one"
                raise HarnessError(msg)
            self._injected += 1
            problem = record_problem(rec)
            if problem is not None:
                self._publish(
                    DEAD_LETTER_STREAM,
                    invalid_record(inj.name, inj.stream, rec, problem, self._injected),
                    MIN_TIMESTAMP,
                )
                continue
            self._publish(inj.stream, rec, self._injector_wm[inj.name])

    def record(
        self, value: Any, timestamp: int, *, key: Key | None = None, id: str | None = None
    ) -> Record:
        """Build a record with a fresh unique id (``"in-<n>"``) unless one is given."""
        if id is None:
            self._injected += 1
            id = f"in-{self._injected}"
        return Record(key, value, timestamp, id)

    def advance_watermark(self, injector: str, timestamp: int) -> None:
        """Advance an injector's low watermark (§5.2). Going back raises :class:`HarnessError`."""
        name = self._injector(injector)
        current = self._injector_wm[name]
        if timestamp < current:
            msg = f"injector {name!r} low watermark cannot go back from {current} to {timestamp}"
            raise HarnessError(msg)
        self._injector_wm[name] = timestamp

    def finish(self, injector: str) -> None:
        """The injector will send nothing more: its low watermark becomes +infinity."""
        self.advance_watermark(injector, MAX_TIMESTAMP)

    def advance_wall_time(self, to: int | None = None, *, by: int | None = None) -> None:
        """Move wall time to ``to`` or forward ``by`` ms. Going back raises :class:`HarnessError`."""
        if (to is None) == (by is None):
            msg = "advance_wall_time takes exactly one of to=... or by=..."
            raise HarnessError(msg)
        target = self._now + by if by is not None else to
        if target < self._now:  # type: ignore[operator]
            msg = f"wall time cannot go back from {self._now} to {target}"
            raise HarnessError(msg)
        self._now = target  # type: ignore[assignment]

    @property
    def now(self) -> int:
        return self._now

    def run(self, *, max_rounds: int = 100_000) -> RunResult:
        """Process and deliver until no computation has input, due timers or undelivered
        output; return what was published since the previous ``run()`` returned
        (:class:`~millwheel.testing.RunResult`: this run's productions and dead letters, and
        the records injected before it). :meth:`values` keeps every stream's whole history."""
        self._settle(max_rounds)
        result = since(self._streams, self._marks)
        self._marks = marks_of(self._streams)
        return result

    def _settle(self, max_rounds: int) -> None:
        for _ in range(max_rounds):
            busy = False
            for name in self._order:
                if self._has_work(name):
                    busy = True
                    self.process(name)
                if self._outbox[name]:
                    busy = True
                    self.deliver(name)
            if not busy:
                return
        msg = f"run() did not settle after {max_rounds} rounds; a timer may keep re-arming itself"
        raise HarnessError(msg)

    def run_sources(self) -> RunResult:
        """Feed every injector's source batch by batch, running the topology after each;
        return what was published since the previous ``run()`` (as :meth:`run` does)."""
        marks = self._marks
        iters = {
            n: i.source.batches(n, i.stream)
            for n, i in self.topology.injectors.items()
            if i.source is not None
        }
        while iters:
            for name in list(iters):
                batch = next(iters[name], None)
                if batch is None:
                    del iters[name]
                    continue
                self.inject(name, batch.records)
                for dead in batch.dead_letters:
                    self._publish(DEAD_LETTER_STREAM, dead, MIN_TIMESTAMP)
                self.advance_watermark(name, max(batch.low_watermark, self._injector_wm[name]))
                self.run()
        result = since(self._streams, marks)
        self._marks = marks_of(self._streams)
        return result

    # ---- one computation -----------------------------------------------------------
    def _has_work(self, name: str) -> bool:
        if self._queues[name]:
            return True
        lw, now = self._input_watermark(name), self._now
        return timers_due(self._lw_timers[name].min(), self._wall_timers[name].min(), lw, now)

    def _due_keys(self, name: str, lw: int, now: int) -> list[Key]:
        """Keys with a timer to fire, in the order they got a timer, found through the indexes."""
        due = self._lw_timers[name].at_most(lw) | self._wall_timers[name].at_most(now)
        if len(due) > 1:
            order = self._timer_order[name]
            return sorted(due, key=order.__getitem__)
        return list(due)

    def process(self, name: str, *, deliver: bool = True, crash: Crash | None = None) -> None:
        """Run one round of computation ``name``: its queued input, then its due timers.

        Strong productions stay checkpointed in the envelopes (holding the low watermark)
        until delivered; ``deliver=False`` leaves them pending. ``crash`` simulates a
        process crash at that point; :meth:`restart` then recovers as MillWheel does.
        """
        runner = self._runner(name)
        if self._closed:
            msg = "the harness is closed (its computations were torn down): results can be read, nothing more run"
            raise HarnessError(msg)
        if name in self._columnar:
            return self._columnar[name].process(self, deliver=deliver, crash=crash)
        lw, now = self._input_watermark(name), self._now
        # the input stays queued (pending work that holds the watermark, §4.5) until the
        # checkpoint ACKs it: weak productions sent before then must not find it gone
        queue = list(self._queues[name])
        per_key: dict[Key, list[tuple[Record, int | None]]] = {}
        for q in queue:
            per_key.setdefault(q.record.key, []).append((q.record, q.arrival_watermark))  # type: ignore[arg-type]
        for key in self._due_keys(name, lw, now):
            if key not in per_key:
                per_key[key] = []
        envelopes = self._envelopes[name]
        staged: dict[Key, KeyOutcome] = {}
        sent: list[_Outgoing] = []
        strong = runner.options.strong_productions
        metrics = StepMetrics()  # counted when the checkpoint commits, not before
        life = self.round_life(name)
        for key, items in per_key.items():
            outcome = run_key(
                runner,
                key,
                envelopes.get(key),
                items,
                low_watermark=lw,
                now=now,
                metrics=metrics,
                life=life,
            )
            sent += [_Outgoing(name, key, p, strong) for p in outcome.productions]
            sent += [_Outgoing(name, key, p, False) for p in outcome.dead_letters]
            staged[key] = outcome
        sent = self._resolve_once(name, sent, staged, metrics)
        # weak productions go out optimistically, before the checkpoint (§6.1.3)
        weak = [out for out in sent if not out.strong]
        if weak:
            wm = self._publish_watermark(name)
            for out in weak:
                self._deliver_one(out, wm)
        if crash is Crash.BEFORE_COMMIT:
            return  # nothing ACKed: the input is delivered again
        del self._queues[name][: len(queue)]  # the checkpoint ACKs the input
        self._rounds[name] += 1
        self._metrics[name].add(metrics)
        for key, o in staged.items():
            self._store(
                name, key, o.envelope, o.hold, (o.next_low_watermark_timer, o.next_wall_timer)
            )
        self._outbox[name] += [o for o in sent if o.strong]
        if crash is Crash.AFTER_COMMIT:
            self._outbox[name] = []  # the in-memory queue of productions dies with the process
            return
        if deliver:
            self.deliver(name, crash=crash)

    def round_life(self, name: str) -> int:
        """The life a key's first production in ``name``'s next round starts (``_identity.py``):
        the same for a replay of a round that crashed before its checkpoint, another for
        every round committed since."""
        return batch_life("harness", self._rounds[name])

    def _resolve_once(
        self, name: str, sent: list[_Outgoing], staged: dict[Key, KeyOutcome], metrics: StepMetrics
    ) -> list[_Outgoing]:
        """Commit the round's ``once_id`` productions to the registry in one call (Photon §2);
        drop those another pipeline holds, from the outgoing list and from the checkpoint."""
        outcome = commit_once(
            [(o.key, o.production) for o in sent],
            self.registry,
            pipeline=self.pipeline_id,
            computation=name,
            metrics=metrics,
        )
        if not outcome.dropped:
            return sent
        by_key: dict[Key, list[str]] = defaultdict(list)
        for o in sent:
            if o.production.record.id in outcome.dropped:
                by_key[o.key].append(o.production.record.id)  # type: ignore[index]
        for key, ids in by_key.items():
            staged_key = staged[key]
            staged_key.envelope, staged_key.hold = acknowledge(staged_key.envelope, ids)
        kept = [o for o in sent if o.production.record.id not in outcome.dropped]
        return kept + [_Outgoing(name, o.record.key, o, False) for o in outcome.dead_letters]

    def deliver(self, name: str, *, crash: Crash | None = None) -> None:
        """Send computation ``name``'s pending strong productions, then acknowledge them."""
        outbox, self._outbox[name] = self._outbox[name], []
        wm = self._publish_watermark(name) if outbox else MIN_TIMESTAMP
        for out in outbox:
            self._deliver_one(out, wm)
        if crash is Crash.AFTER_DELIVER:
            return
        if name in self._columnar:
            return self._columnar[name].acknowledge(self, [o.production.record.id for o in outbox])
        by_key: dict[Key, list[str]] = defaultdict(list)
        for out in outbox:
            by_key[out.key].append(out.production.record.id)  # type: ignore[index]
        for key, ids in by_key.items():
            env, hold = acknowledge(self._envelopes[name].get(key), ids)
            self._store(
                name,
                key,
                env,
                hold,
                (self._lw_timers[name].get(key), self._wall_timers[name].get(key)),
            )

    def restart(
        self, name: str, code: type | None = None, *, options: ComputationOptions | None = None
    ) -> None:
        """Recover computation ``name`` after a crash: rescan envelopes for pending productions (§7.1).

        A fresh instance replaces the old one (its ``teardown()`` is called, as a clean
        stop would; a real crash would not). ``code`` (``options``: default its class's): the
        next version of the class, resuming from what the old one committed (its state upgraded
        as read, ``docs/concepts.md`` "Schema evolution"); the topology runs it from then on."""
        runner = self.topology.computations[name]
        old = self._runner(name)
        old.computation.teardown()
        opts = old.options
        if code is not None or options is not None:
            new = options or getattr(code, "options", None) or runner.options
            runner = dataclasses.replace(runner, cls=code or runner.cls, options=new)
            self.topology.computations[name] = runner
            raising = old.options.on_error is ErrorPolicy.RAISE  # ``raise_errors`` holds
            opts = _with(new, on_error=ErrorPolicy.RAISE) if raising else new
        self._runners[name] = StepRunner(
            runner.instantiate(), name=name, outputs=runner.all_outputs, options=opts
        )
        if name in self._columnar:
            self._columnar[name].restarted(self._runners[name])
            self._outbox[name] = [
                _Outgoing(name, p.record.key, p, True) for p in self._columnar[name].pending()
            ]
            return
        self._outbox[name] = [
            _Outgoing(name, key, p, True)
            for key, env in self._envelopes[name].items()
            for p in pending_productions(env)
        ]

    def close(self) -> None:
        """Call every computation's ``teardown()`` (once); ``with Harness(...) as h:`` does it."""
        if self._closed:
            return
        self._closed = True
        for runner in self._runners.values():
            runner.computation.teardown()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------
    def _runner(self, name: str) -> StepRunner:
        if name not in self._runners:
            known = ", ".join(self._order) or "none"
            msg = f"no computation named {name!r} (computations: {known})"
            raise HarnessError(msg)
        return self._runners[name]

    def _store(
        self,
        name: str,
        key: Key,
        env: bytes | None,
        hold: int | None,
        timers: tuple[int | None, int | None],
    ) -> None:
        envs, holds, order = self._envelopes[name], self._holds[name], self._timer_order[name]
        if env is None:
            envs.pop(key, None)
        else:
            envs[key] = env
        holds.put(key, hold)
        if timers == (None, None):
            order.pop(key, None)
        elif key not in order:
            order[key] = next(self._timer_seq)
        self._lw_timers[name].put(key, timers[0])
        self._wall_timers[name].put(key, timers[1])

    def _deliver_one(self, out: _Outgoing, sender_watermark: int) -> None:
        p = out.production
        rec = p.record
        if p.encoded is not None:  # consumers get a copy, as from a stream log
            rec = Record(rec.key, decode_value(p.encoded), rec.timestamp, rec.id, rec.stream)
        self._publish(p.stream, rec, sender_watermark)

    def _publish(self, stream: str, rec: Record, sender_watermark: int) -> None:
        self._streams[stream].append(rec)
        if rec.stream != stream:  # extractors see the stream a record is read from
            rec = Record(rec.key, rec.value, rec.timestamp, rec.id, stream)
        for consumer in self.topology.consumers(stream):
            name = consumer.name
            keyed, dead = key_record(
                name, stream, consumer.inputs[stream], rec, self._runners[name].options.on_error
            )
            if keyed is not None:
                arrival = min(sender_watermark, self._input_watermark(name))
                self._queues[name].append(_Queued(keyed, arrival))
                continue
            count_keying(self._metrics[name], dead is None)
            if dead is not None:
                self._publish(DEAD_LETTER_STREAM, dead, MIN_TIMESTAMP)

    def _input_watermark(self, name: str) -> int:
        ups = self.topology.upstream(name)
        return min((self._publish_watermark(u) for u in ups), default=MAX_TIMESTAMP)

    def _publish_watermark(self, name: str) -> int:
        """Publish ``name``'s low watermark as of now (§7.2: published values never go back)."""
        if name in self._injector_wm:
            return self._injector_wm[name]
        value = max(self._published[name], self._current_watermark(name))
        self._published[name] = value
        return value

    def _current_watermark(self, name: str) -> int:
        return low_watermark(self._oldest_work(name), self._input_watermark(name))

    def _oldest_work(self, name: str) -> int:
        oldest = MAX_TIMESTAMP
        for q in self._queues[name]:
            oldest = min(oldest, q.record.timestamp)
        held = self._holds[name].min()
        if held is not None:
            oldest = min(oldest, held)
        for out in self._outbox[name]:
            oldest = min(oldest, out.production.record.timestamp)
        return oldest

    # ---- reading -------------------------------------------------------------------
    def low_watermark(self, name: str) -> int:
        """The low watermark of an injector or computation as of now (§4.5); never goes back.

        Reading it changes nothing: the harness publishes watermarks only where the
        topology itself reads them (when it delivers and processes), so a test that
        looks at a watermark runs exactly as one that does not.
        """
        if name in self._injector_wm:
            return self._injector_wm[name]
        self._runner(name)
        return max(
            self._published[name],
            low_watermark(self._oldest_work(name), self._pure_input_watermark(name)),
        )

    def _pure_input_watermark(self, name: str) -> int:
        return min(
            (self.low_watermark(u) for u in self.topology.upstream(name)), default=MAX_TIMESTAMP
        )


def _with(options: ComputationOptions, **changes: Any) -> ComputationOptions:
    return dataclasses.replace(options, **changes)
