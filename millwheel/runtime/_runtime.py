"""The Spark runtime: runs a :class:`~millwheel.Topology` as one Spark query per computation.

    from millwheel.runtime import SparkRuntime, RuntimeSettings

    rt = SparkRuntime(topology, "/tmp/run", RuntimeSettings(drain=True))
    rt.run()                           # until finite inputs are drained and timers flushed
    rt.values("window_counts")         # what the computations produced

The driver loop (:meth:`SparkRuntime.poll`) feeds driver-side injectors, publishes the
output of committed batches (strong productions, §6.1.2), computes each computation's
low watermark (§4.5, §7.2) and reports it to the watermark authority, and writes the
heartbeats that carry the input low watermark into each query. See ``docs/runtime.md``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from millwheel._columnar import is_columnar
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._envelope import Envelope
from millwheel._errors import MillwheelError
from millwheel._logfile import LogFileSource
from millwheel._once import PipelineNameTaken, join_roster, pipeline_id
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Key, Record, decode_key
from millwheel._sparkio import SparkSource
from millwheel._topology import Topology
from millwheel._waits import WAITS, read_waits
from millwheel.runtime._audit import AuditLog
from millwheel.runtime._fieldcols import pin_fields
from millwheel.runtime._fs import Location
from millwheel.runtime._injectors import LogFileInjector, SourceInjector
from millwheel.runtime._keying import Keyer
from millwheel.runtime._layout import Layout, computation_layouts, own_intervals, read_pin
from millwheel.runtime._lease import DriverEpoch
from millwheel.runtime._online import OnlineRescaler
from millwheel.runtime._query import ComputationQuery, prune_streams
from millwheel.runtime._runpin import (  # re-exported: tests, the photon tools
    PINNED_SETTINGS as PINNED_SETTINGS,
)
from millwheel.runtime._runpin import (
    pin_groups,
    pin_pipeline,
    pin_run_settings,
    resolve_intervals,
    where_of,
)
from millwheel.runtime._runpin import run_identity as run_identity
from millwheel.runtime._session import (
    checkpoint_conf,
    restore_conf,
    session_master,
    set_conf,
    warm_python_workers,
)
from millwheel.runtime._settings import RuntimeSettings, resolved_computation_poll_ms
from millwheel.runtime._sinks import SinkWriter, sink_writers
from millwheel.runtime._spark_internals import STATE
from millwheel.runtime._sparksink import SparkSinkWriter, spark_sink_writers
from millwheel.runtime._sparksource import SparkSourceInjector
from millwheel.runtime._streams import FileStreamLog
from millwheel.runtime._usercode import ship_user_code

__all__ = ["RuntimeSettings", "SparkRuntime", "committed_envelopes", "lag_text"]


class SparkRuntime:
    """Runs a topology on Spark Structured Streaming; see the module docstring.

    It is the :class:`~millwheel.runtime._context.DriverContext` its queries and injectors
    are built with: they see that narrow interface, not the runtime.
    """

    def __init__(
        self,
        topology: Topology,
        root: str,
        settings: RuntimeSettings | None = None,
        *,
        spark: Any = None,
        watermarks: Any = None,
        log: Callable[[str], None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.topology = topology.validate()
        self.root = Location.of(root)
        held = read_pin(self.root)
        settings = settings or RuntimeSettings()
        #: the run-wide key intervals: as given, the run's own, or the master's default
        self.intervals = resolve_intervals(
            settings, held, settings.master if spark is None else session_master(spark)
        )
        self.settings = dataclasses.replace(
            settings,
            intervals=self.intervals,
            computation_poll_ms=resolved_computation_poll_ms(
                settings, [inj.source for inj in self.topology.injectors.values()]
            ),
        )
        #: every consumer's key extractor: producers key what they write (``_keying.py``), for
        #: each consumer's interval count (a rescaled one has its own: ``_layout.py``)
        self.keyer = Keyer.of(self.topology, self.intervals, own_intervals(held))
        self.streams = FileStreamLog(self.root, self.keyer)
        #: the epoch every query's lease is taken under (``_lease.py``): one per driver start
        self.driver_epoch = DriverEpoch(self.root.child("leases"))
        self._spark = spark
        if watermarks is None:
            from watermark_authority.client import InProcessWatermarkClient

            watermarks = InProcessWatermarkClient()
        self.watermarks = watermarks
        #: the audit trail a checker reads (``_audit.py``): published watermarks, batches
        self.audit = AuditLog(self.root)
        self._log = log or (lambda msg: print(f"millwheel: {msg}", file=sys.stderr))
        #: called with "injector NAME" / "computation NAME" as each query starts (``millwheel run`` shows it)
        self._progress = progress or (lambda _what: None)
        only = set(self.settings.only)
        unknown = only - set(topology.injectors) - set(topology.computations)
        if unknown:
            msg = f"RuntimeSettings.only names {sorted(unknown)}, which topology {topology.name!r} does not have"
            raise MillwheelError(msg)
        self.injectors: dict[str, Any] = {}
        for name, spec in topology.injectors.items():
            if only and name not in only:
                continue
            if isinstance(spec.source, SparkSource):
                self.injectors[name] = SparkSourceInjector(self, spec)
            elif isinstance(spec.source, LogFileSource) and not self.settings.lockstep:
                self.injectors[name] = LogFileInjector(self, spec)
            else:
                self.injectors[name] = SourceInjector(self, spec)
        self.order = [n for n in topology.order() if not only or n in only]
        self.computations = {
            name: ComputationQuery(self, topology.computations[name]) for name in self.order
        }
        #: sinks with a target: each follows its stream log and writes committed files once (``_sinks.py``)
        here = set(self.injectors) | set(self.computations)
        self.sinks: list[SinkWriter | SparkSinkWriter] = [
            s
            for s in sink_writers(topology, self.streams, self.root)
            if here & set(self.producers(s.spec.stream))
        ]
        #: sinks through Spark (``SparkSink``: Kafka, tables, foreachBatch), fed the same committed files (``_sparksink.py``)
        self.sinks += [
            w
            for w in spark_sink_writers(
                topology, self.streams, self.root, lambda: self.spark, self.log
            )
            if here & set(self.producers(w.spec.stream))
        ]
        self.started = False
        #: this run directory's identity in once-tokens (:func:`pin_pipeline`), set by :meth:`start`
        self.pipeline_id: str | None = None
        #: the Spark grouping value of each key interval (:func:`pin_groups`), known at start
        self.groups: list[int] = list(range(self.intervals))
        #: each computation's key intervals (``_layout.py``): the run-wide ones, or its own after a rescale
        self.layouts: dict[str, Layout] = {}
        #: session settings this run changed, to restore at :meth:`stop` (``_session.set_conf``)
        self._saved_conf: dict[str, str | None] | None = None
        self._pruned_at = 0.0
        self.started_at = 0.0
        #: the published watermarks read in this round of the driver loop (:meth:`watermark_of`)
        self._read: dict[str, int] = {}
        #: online rescales asked of this driver, and the automatic policy (``_online.py``)
        self.rescaler = OnlineRescaler(self)

    # ---- wiring ------------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        if self._spark is None:
            from millwheel.runtime._session import spark_session

            self._spark = spark_session(
                self.settings.master,
                shuffle_partitions=self.settings.shuffle_partitions,
                conf=dict(self.topology.spark_conf) or None,
            )
        return self._spark

    @property
    def master(self) -> str | None:
        """The session's master once it is up, else the settings' (``None``: spark-submit's)."""
        if self._spark is not None:
            return session_master(self._spark)
        return self.settings.master

    def use_session(self, spark: Any) -> None:
        """The session to run on, given after :meth:`start_readers` (``millwheel run`` starts
        Spark meanwhile); it must run on the master the runtime was built for."""
        if self._spark is not None and self._spark is not spark:
            msg = "this runtime already has a Spark session"
            raise MillwheelError(msg)
        master = session_master(spark)
        if master is not None and master != self.settings.master:
            msg = f"this runtime was built for master {self.settings.master!r}, not the session's {master!r}"
            raise MillwheelError(msg)
        self._spark = spark

    def start_readers(self) -> None:
        """Start the log-file injectors the driver reads (``RuntimeSettings.log_reader``)
        before Spark is up: they need no JVM, and the computations' first batches then find
        their records (docs/runtime.md, "Log-file readers"). :meth:`start` starts the rest;
        it is what a run calls either way, so this is only ever a head start."""
        early = [
            i
            for i in self.injectors.values()
            if isinstance(i, LogFileInjector) and i.reader_kind() == "driver"
        ]
        if self.started or not early:
            return
        self._prepare()  # the keyer the readers pickle holds the user's extractors
        self.driver_epoch.get()  # every lease is taken under it: drawn once, before the threads
        for injector in early:
            self._progress(f"injector {injector.name}")
            injector.start()

    def layout(self, computation: str) -> Layout:
        """``computation``'s key intervals and their Spark groups (known at :meth:`start`)."""
        lay = self.layouts.get(computation)
        if lay is None:
            return Layout(
                self.keyer.intervals_of(computation),
                tuple(self.groups),
                state_layout=self.settings.state_layout,
            )
        return lay

    def producers(self, stream: str) -> list[str]:
        """Who writes ``stream``: one stream-log directory each."""
        return self.topology.producers(stream)

    def upstream(self, name: str) -> list[str]:
        return self.topology.upstream(name)

    def heartbeat_consumers(self, producer: str) -> list[Any]:
        return [
            c
            for name, c in self.computations.items()
            if producer in c.upstream and c.query is not None and not self.rescaler.busy(name)
        ]

    def caught_up(self, low_watermark: int) -> bool:
        """Every computation's low watermark has reached ``low_watermark`` (lockstep)."""
        return all(c.low_watermark >= low_watermark for c in self.computations.values())

    def watermark_of(self, name: str, *, fresh: bool = False) -> int:
        """``name``'s published low watermark, read from the authority once per round of the
        driver loop (:meth:`poll`) unless ``fresh``: each read is a request to it, and a round
        read each upstream watermark up to three times. A value read earlier in the round is
        older, never higher (published watermarks only move forward), so it is as safe a
        bound on what the producer publishes later; a computation reads its own ``fresh``
        after reporting, so its consumers later in the round see the new value."""
        value = None if fresh else self._read.get(name)
        if value is None:
            value = self._read[name] = self.audit.watermark(name, self.watermarks.watermark)
        return value

    def log(self, msg: str) -> None:
        self._log(msg)

    # ---- running -----------------------------------------------------------------------
    def claim(self) -> str:
        """Pin the run directory's settings and identity and enter the registry's roster; the
        pipeline identity (:meth:`start` claims first; a caller may claim before, to write what
        belongs with a run only once the directory is one).

        A start the roster refuses (another run directory holds the name) leaves the directory
        as it found it: a ``run.json`` this call wrote is removed again, so nothing makes the
        directory look like a run (verification reads its identity there).
        """
        if self.pipeline_id is not None:
            return self.pipeline_id
        pin = self.root.child("run.json")
        before = pin.read_text()
        self.root.mkdirs()
        pin_run_settings(self.root, self.settings)
        pin_fields(
            self.root, self.topology.fields
        )  # a stream's files hold its values in columns of these types
        name, epoch = pin_pipeline(self.root, self.settings.pipeline)
        if self.settings.registry is not None:
            registry = self.settings.registry()
            try:
                join_roster(registry, name, epoch, where_of(self.root))
            except PipelineNameTaken as exc:
                if before is None:
                    pin.delete()
                else:
                    pin.write_text(before)
                raise MillwheelError(str(exc)) from None
            finally:
                getattr(registry, "close", lambda: None)()
        self.pipeline_id = pipeline_id(name, epoch)
        return self.pipeline_id

    def _prepare(self) -> None:
        """What a start does before Spark is needed (again at once if done before): claim the
        run directory, ship the user's code, make every producer's stream directory."""
        self.claim()
        self.root.child("tallies").mkdirs()
        ship_user_code(self.topology)
        for stream in self.topology.streams():
            for producer in self.producers(stream):
                self.streams.ensure(stream, producer)

    def start(self) -> None:
        if self.started:
            return
        # registering the first Python data source makes Spark look up every installed one in
        # a Python process of its own (~1.5 s, once per session): a log-file injector's start
        # waits for it, so it runs beside the setup below (docs/performance.md, "The main job")
        registering = _Starting(
            [i for i in self.injectors.values() if isinstance(i, LogFileInjector)],
            lambda _: None,
            "register",
        )
        registering.start()
        self._prepare()
        for sink in self.sinks:
            sink.start()
        # for the whole run: the file sources' logs take it on the queries' own threads
        self._saved_conf = set_conf(self.spark, checkpoint_conf(self.root))
        self.groups = pin_groups(
            self.root,
            self.intervals,
            int(self.spark.conf.get("spark.sql.shuffle.partitions")),
        )
        held = read_pin(self.root)
        if own_intervals(held) != self.keyer.own:
            msg = (
                f"run directory {self.root.uri}: run.json gives computations their own key intervals {own_intervals(held)}, "
                f"not the {self.keyer.own} this runtime was built with (rescaled meanwhile?); build the runtime again"
            )
            raise MillwheelError(msg)
        self.layouts = computation_layouts(
            held, list(self.topology.computations), self.intervals, self.groups
        )
        # the workers start while the queries are planned and started (the driver's and the
        # JVM's work, not the workers'): on 2 cores the two overlap by ~3 s (docs/performance.md)
        warming = threading.Thread(
            target=self._warm_workers, name="millwheel-warm-workers", daemon=True
        )
        warming.start()
        registering.join()
        registering.reraise()
        self.driver_epoch.get()  # every lease is taken under it: drawn once, before the threads
        # the injectors start on a thread of their own while the computations start here: a
        # log-file injector's start is mostly Python Data Source planning in worker processes,
        # a computation's the driver's plan; neither reads what the other writes
        # (docs/runtime.md, "Running")
        injecting = _Starting(  # not those :meth:`start_readers` started
            [i for i in self.injectors.values() if not getattr(i, "reading", False)],
            self._progress,
        )
        injecting.start()
        try:
            for name in self.order:
                self._progress(f"computation {name}")
                self.computations[name].start()
        finally:
            injecting.join()
        injecting.reraise()
        warming.join()
        self.driver_epoch.mark(stopped=False)
        self.started = True
        self.started_at = time.monotonic()

    def _warm_workers(self) -> None:
        try:
            warm_python_workers(self.spark)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the queries start their own workers
            self.log(
                f"warming the Python workers failed ({str(exc).strip().splitlines()[0][:200]}); the queries start their own"
            )

    def poll(self) -> None:
        """One round of the driver loop."""
        now = int(time.time() * 1000)
        self._read.clear()
        for inj in self.injectors.values():
            inj.check()
            inj.poll()
        self.rescaler.poll()
        for name in self.order:
            if self.rescaler.busy(name):
                continue  # its query is stopped while its state moves
            c = self.computations[name]
            c.check()
            c.update_watermark(now)
        self._prune()
        for sink in self.sinks:
            sink.poll()

    def _prune(self, *, now: bool = False) -> None:
        """With ``prune_streams``: move consumed stream files to ``_done/`` (at most once a
        second while running; ``now`` at the end of a drained run, so none is left live)."""
        if (
            self.settings.prune_streams
            and not self.settings.only
            and (now or time.monotonic() - self._pruned_at >= 1.0)
        ):
            prune_streams(list(self.computations.values()), self.streams)
            self._pruned_at = time.monotonic()

    def drained(self) -> bool:
        return (
            all(i.drained() for i in self.injectors.values())
            and all(c.drained() for c in self.computations.values())
            and not self.rescaler.active()
            and all(
                s.caught_up() for s in self.sinks if hasattr(s, "caught_up")
            )  # a Spark sink waiting out its target's outage
        )

    def run(
        self,
        *,
        timeout_s: float | None = None,
        on_status: Callable[[SparkRuntime], None] | None = None,
    ) -> None:
        """Start, loop until drained (every low watermark +inf), interrupted or timed out, then stop."""
        self.start()
        last_status = time.monotonic()
        try:
            while True:
                self.poll()
                if self.drained():
                    self._prune(now=True)
                    break
                if timeout_s is not None and time.monotonic() - self.started_at > timeout_s:
                    msg = f"topology {self.topology.name!r} did not drain within {timeout_s}s: {self.status()}"
                    raise MillwheelError(msg)
                every = self.settings.status_every_s
                if (
                    on_status is not None
                    and every is not None
                    and time.monotonic() - last_status >= every
                ):
                    on_status(self)
                    last_status = time.monotonic()
                time.sleep(self.settings.poll_ms / 1000)
        finally:
            self.stop()

    def stop(self) -> None:
        from millwheel.runtime._session import quiet_while_stopping

        self.rescaler.stop()
        with quiet_while_stopping(self._spark):
            for c in self.computations.values():
                c.stop()
            for inj in self.injectors.values():
                inj.stop()
        self.driver_epoch.mark(
            stopped=True
        )  # ``millwheel rescale`` checks that no driver runs (``_lease.live_drivers``)
        if self._saved_conf is not None:
            restore_conf(self._spark, self._saved_conf)
            self._saved_conf = None
        self.started = False

    # ---- reading -----------------------------------------------------------------------
    def status(self) -> dict[str, dict[str, Any]]:
        now = int(time.time() * 1000)
        out: dict[str, dict[str, Any]] = {}
        for name, inj in self.injectors.items():
            out[name] = {"kind": "injector", **inj.status()}
        for name, c in self.computations.items():
            out[name] = {"kind": "computation", **c.status(), **self.rescaler.status(name)}
        waits = read_waits(self.root.child(WAITS).path) if self.root.local else []
        if waits:  # a dependency is out and calls are being retried (``millwheel/_waits.py``): say what, since when
            text = "; ".join(w.text() for w in waits)
            for name in self.computations:
                out[name]["waiting"] = text
                out[name]["warning"] = (
                    text if not out[name].get("warning") else f"{out[name]['warning']}; {text}"
                )
        for v in out.values():
            lw = v["low_watermark"]
            v["lag_ms"] = None if lw in (MIN_TIMESTAMP, MAX_TIMESTAMP) else now - lw
        return out

    def output(self, stream: str) -> list[Record]:
        """Every record published to ``stream`` (re-deliveries included)."""
        return self.streams.read(stream)

    def values(self, stream: str) -> list[Any]:
        return [r.value for r in self.output(stream)]

    def dead_letters(self) -> list[Record]:
        return self.output(DEAD_LETTER_STREAM)

    def envelopes(self, computation: str) -> dict[Key, bytes]:
        """The committed envelopes of a computation's keys, read from Spark's state store."""
        return committed_envelopes(self.spark, self.computations[computation].checkpoint)

    def states(self, computation: str) -> dict[Key, Any]:
        """Decoded user state of every key of ``computation`` (for tests and inspection);
        a columnar computation's: each key's state rows (``millwheel state``'s reader)."""
        spec = self.topology.computations[computation]
        if is_columnar(spec.cls):
            from millwheel.runtime._state_reader import read_state

            return {
                k.key: k.state
                for k in read_state(self.spark, self.root.uri, computation).keys
                if k.state is not None
            }
        out: dict[Key, Any] = {}
        for key, env in self.envelopes(computation).items():
            raw = Envelope.decode(env).state
            if raw is not None:
                out[key] = spec.options.state_codec.decode(raw)
        return out


class _Starting(threading.Thread):
    """Starts injectors (or calls another method of theirs, ``step``) one after the other on a
    thread of its own (:meth:`SparkRuntime.start`); :meth:`reraise` gives the first failure
    to the thread that joined it."""

    def __init__(
        self, injectors: list[Any], progress: Callable[[str], None], step: str = "start"
    ) -> None:
        super().__init__(name=f"millwheel-{step}-injectors", daemon=True)
        self.injectors = injectors
        self.progress = progress
        self.step = step
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for inj in self.injectors:
                self.progress(f"injector {inj.name}")
                getattr(inj, self.step)()
        except BaseException as exc:  # noqa: BLE001 - raised again in the starting thread
            self.error = exc

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def committed_envelopes(
    spark: Any, checkpoint: Location, batch_id: int | None = None
) -> dict[Key, bytes]:
    """The envelopes of a computation's keys as of committed batch ``batch_id`` (default: the last).

    Through ``_spark_internals.read_envelopes`` (interval rows or per-key rows), as
    ``millwheel state`` (``_state_reader.py``), which also reads columnar stores. Read-only:
    Spark's state data source reads the checkpoint's state files and writes nothing, so it
    is safe while the run goes on.
    """
    from millwheel.runtime._spark_internals import read_envelopes

    if not checkpoint.child(STATE).exists():
        return {}
    return {
        decode_key(kb): env for kb, env in read_envelopes(spark, checkpoint.uri, batch_id).items()
    }  # type: ignore[misc]


def lag_text(lw: int, now_ms: int | None = None) -> str:
    if lw >= MAX_TIMESTAMP:
        return "done"
    if lw <= MIN_TIMESTAMP:
        return "-"
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{(now_ms - lw) / 1000:.1f}s"
