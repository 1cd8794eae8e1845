"""How the Spark runtime runs a topology: one frozen settings object (not a 30-argument constructor)."""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from millwheel._errors import SettingsError

__all__ = [
    "CLUSTER_INTERVALS",
    "COLUMNAR_INPUT_REMOVED",
    "INTERVALS_PER_CORE",
    "OUTBOX_WRITERS",
    "STATE_LAYOUTS",
    "RuntimeSettings",
    "SettingsError",
    "StateLayout",
    "default_intervals",
    "master_cores",
]

#: key intervals per core of a ``local[N]`` master on a run directory's first start without
#: ``intervals`` (docs/runtime.md, "intervals"): each core runs two, so one slow interval
#: leaves its core's other to even out, and a split has intervals to work with
INTERVALS_PER_CORE = 2
#: the same for any other master: its cores are not known before its executors register
CLUSTER_INTERVALS = 16


def _local_cores(master: str | None) -> int | None:
    """The cores a local master runs tasks on (``local``: 1; ``local[*]``: this machine's);
    ``None`` for any other master."""
    if master == "local":
        return 1
    if master is None or not master.startswith("local["):
        return None
    inner = master[len("local[") : -1].split(",")[0]
    if inner == "*":
        return os.cpu_count() or 2
    try:
        return int(inner)
    except ValueError:
        return 2


def master_cores(master: str | None) -> int:
    """The cores a ``local[N]`` master runs tasks on (``local[*]``: this machine's; ``local``: 1); 8 for any other."""
    cores = _local_cores(master)
    return 8 if cores is None else cores


def default_intervals(master: str | None) -> int:
    """A first start's key intervals when none are given: :data:`INTERVALS_PER_CORE` per core
    of a ``local[N]`` master (at least 2), :data:`CLUSTER_INTERVALS` on any other.

    >>> default_intervals("local[2]"), default_intervals("local"), default_intervals("spark://h:7077")
    (4, 2, 16)
    """
    cores = _local_cores(master)
    return CLUSTER_INTERVALS if cores is None else max(2, INTERVALS_PER_CORE * cores)


class StateLayout(enum.StrEnum):
    """Where a computation's envelopes live (``RuntimeSettings.state_layout``; ``docs/runtime.md``,
    "Plans"). The strings ``"intervals"`` / ``"keys"`` are accepted too."""

    #: one ``applyInPandasWithState`` row per key interval (the default)
    INTERVALS = "intervals"
    #: one state-store row per key (``transformWithStateInPandas`` + RocksDB)
    KEYS = "keys"

    def __repr__(self) -> str:
        # as the string: messages name the value as a user writes it (``state_layout='keys'``)
        return repr(self.value)

    @classmethod
    def parse(cls, value: object, what: str = "RuntimeSettings.state_layout") -> StateLayout:
        """``value`` as a :class:`StateLayout` (a member or its string); :class:`SettingsError` otherwise."""
        try:
            return cls(value)  # type: ignore[arg-type]
        except ValueError:
            msg = f"{what} must be one of {', '.join(map(repr, STATE_LAYOUTS))}, got {value!r}"
            raise SettingsError(msg) from None


@dataclass(frozen=True)
class RuntimeSettings:
    """How the Spark runtime runs a topology.

    * ``intervals`` — key intervals (Spark groups) per computation (§7.1): more means less
      state rewritten per touched interval, fewer means less per-group overhead. ``None``
      (the default): a run directory that has started keeps its own (``run.json``); a first
      start takes :func:`default_intervals` of the master — two per core on ``local[N]``,
      16 on a cluster.
    * ``trigger_ms`` — micro-batch trigger interval (0: as soon as the previous ends).
    * ``poll_ms`` / ``heartbeat_ms`` — driver loop period; minimum gap between heartbeats.
    * ``drain`` — log-file injectors treat their files as complete (finite input), so the
      run ends. Whatever the setting, :meth:`SparkRuntime.run` returns once every injector
      is finished and every low watermark is +inf (inputs drained, timers flushed):
      nothing can happen after that.
    * ``injector_poll_ms`` — how long a log-file injector's query waits before it looks
      at its directory again after a look found nothing new (Spark's own default is 10 ms).
      Each look is a round trip to the query's Python planner, which lists and stats the
      directory and sends back every file's progress: at 10 ms three idle injectors took
      ~4 s of CPU of a 13 s Photon run on 2 cores (docs/performance.md, "Photon and the
      IdRegistry"). New data waits at most this long more to be seen, and only after a
      look that found none.
    * ``computation_poll_ms`` — how long a computation's query waits before it lists its
      inputs again after a look found nothing new. Each look lists the query's input and
      heartbeat directories in the JVM (~35-40 ms on 2 cores). ``None`` (the default):
      Spark's own 10 ms in a live run, where a record is picked up soonest; 100 ms when
      every injector's source ends by itself (a ``finite`` log directory, a
      :class:`~millwheel.SampleSource`), where the idle queries' looks would take the cores
      the busy ones need (:func:`resolved_computation_poll_ms`; docs/performance.md, "The
      main job"). ``drain`` does not count: it stops a run whose records may still come
      at their own pace (a paced benchmark).
    * ``max_files_per_trigger`` — cap per input stream per batch (benchmarks).
    * ``lockstep`` — every injector runs in the driver and releases its next source batch
      only once every computation's low watermark has caught up with the injector's: the
      low watermarks then move through the same values as in the harness's
      ``run_sources`` (differential tests, reproducible demos). Slow: one round trip per batch.
    * ``only`` — run only these injectors and computations; the others run in another
      driver on the same run directory, and their low watermarks come from the shared
      watermark authority. This is how a computation joins a running topology without
      restarting the others (``docs/runtime.md``).
    * ``pipeline`` / ``registry`` — this pipeline's name and a picklable zero-argument
      factory of the IdRegistry client that ``produce(..., once_id=...)`` commits to
      (Photon §2; ``millwheel/_once.py``). Pipelines reading the same input share a
      registry under different names.
    * ``state_layout`` — where envelopes live (``docs/runtime.md``, "Plans"):
      :attr:`StateLayout.INTERVALS` (the default: one ``applyInPandasWithState`` row per key
      interval) or :attr:`StateLayout.KEYS` (one state-store row per key,
      ``transformWithStateInPandas`` + RocksDB: a batch costs the keys it touches, for very
      large key spaces); the strings ``"intervals"`` / ``"keys"`` are taken too. Fixed for
      the life of a checkpoint. ``$MILLWHEEL_STATE_LAYOUT`` sets the default (how the test
      suite runs on either).
    * ``outbox_writer`` — who writes a micro-batch's output to the outbox before the commit
      (``_outbox.py``): ``"driver"`` (the batch's rows collected as Arrow and written by the
      driver, one file per stream: no write job, no Hadoop output committer, fewer and
      larger stream-log files; the driver holds one batch's output), ``"spark"`` (the
      executors, through Spark's Parquet writer, one file per stream and key interval: a
      batch's output never passes through the driver), or ``"auto"`` (the default:
      ``"driver"`` on a ``local[...]`` master, where the executors are the driver's JVM,
      and ``"spark"`` on a cluster). ``$MILLWHEEL_OUTBOX_WRITER`` sets the default.
    * ``log_reader`` — who reads a :class:`~millwheel.LogFileSource` (``_logreader.py``):
      ``"spark"`` (a streaming query over a Python data source: its tasks parse the byte
      ranges on the executors, in parallel), ``"driver"`` (a thread of the driver plans the
      same batches and parses them with the same code, and stages them in the same outbox
      under the same offset and commit logs: no query, no planner processes, no rows through
      the JVM), or ``"auto"`` (the default: ``"driver"`` on a ``local[...]`` master, where
      the executors share the driver's machine, ``"spark"`` on a cluster).
      ``$MILLWHEEL_LOG_READER`` sets the default. A run directory may be resumed with the
      other reader: both keep the same checkpoint (docs/runtime.md, "Log-file readers").
    * ``prune_streams`` — move stream-log files that every computation of this driver has
      consumed in a committed batch out of the directories consumers list (``_done/``), so
      listings stay short in long runs (``_streams.py``, "Pruning"). Off by default: a
      computation added later with ``only`` reads a stream from its live files. Heartbeat
      files, which only their own query reads, are always pruned.
    * ``autoscale`` — an :class:`~millwheel.runtime._autoscale.AutoscalePolicy` (``None``: off,
      the default): the driver splits a computation's key intervals when some are far
      hotter than the median for several batches, and merges them when all are cold, by
      online rescales (``_online.py``, ``_autoscale.py``, MillWheel §7.1); ``millwheel run
      --autoscale``.

    ``columnar_input`` was removed: passing it is refused with :data:`COLUMNAR_INPUT_REMOVED`.
    A columnar computation reads the records its producer keyed from the micro-batch's
    files, and the others as rows (``docs/runtime.md``, "Plans").
    * ``stall_warning_s`` — warn (log line, ``status()["warning"]``) when a log-file
      injector's low watermark has not moved for this long, naming the unfinished file
      that holds it.
    """

    intervals: int | None = None
    master: str = "local[2]"
    shuffle_partitions: int | None = None
    trigger_ms: int = 0
    poll_ms: int = 100
    heartbeat_ms: int = 200
    injector_poll_ms: int = 200
    computation_poll_ms: int | None = None
    drain: bool = False
    max_files_per_trigger: int | None = None
    injector_batches_per_poll: int = 1
    max_restarts: int = 20
    status_every_s: float | None = None
    lockstep: bool = False
    only: tuple[str, ...] = ()
    stall_warning_s: float = 60.0
    pipeline: str = "default"
    registry: Callable[[], Any] | None = None
    prune_streams: bool = False
    #: a :class:`StateLayout` once made (a string given is read as its member)
    state_layout: StateLayout | str = field(
        default_factory=lambda: os.environ.get("MILLWHEEL_STATE_LAYOUT", "intervals")
    )
    outbox_writer: str = field(
        default_factory=lambda: os.environ.get("MILLWHEEL_OUTBOX_WRITER", "auto")
    )
    log_reader: str = field(default_factory=lambda: os.environ.get("MILLWHEEL_LOG_READER", "auto"))
    autoscale: Any = None

    def __post_init__(self) -> None:
        if self.intervals is not None and (
            isinstance(self.intervals, bool)
            or not isinstance(self.intervals, int)
            or self.intervals < 1
        ):
            msg = f"RuntimeSettings.intervals must be a whole number >= 1 (or None: the run's own, else the master's default), got {self.intervals!r}"
            raise SettingsError(msg)
        for name in ("injector_poll_ms", "computation_poll_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                msg = f"RuntimeSettings.{name} must be a whole number >= 0 (milliseconds), got {value!r}"
                raise SettingsError(msg)
        object.__setattr__(self, "state_layout", StateLayout.parse(self.state_layout))
        if self.outbox_writer not in OUTBOX_WRITERS:
            msg = f"RuntimeSettings.outbox_writer must be one of {', '.join(map(repr, OUTBOX_WRITERS))}, got {self.outbox_writer!r}"
            raise SettingsError(msg)
        if self.log_reader not in OUTBOX_WRITERS:
            msg = f"RuntimeSettings.log_reader must be one of {', '.join(map(repr, OUTBOX_WRITERS))}, got {self.log_reader!r}"
            raise SettingsError(msg)


_dataclass_init = RuntimeSettings.__init__


@functools.wraps(_dataclass_init)
def _init(self: RuntimeSettings, *args: Any, **kwargs: Any) -> None:
    if "columnar_input" in kwargs:  # a removed field: refused with why, not a bare TypeError
        msg = f"RuntimeSettings(columnar_input={kwargs['columnar_input']!r}): {COLUMNAR_INPUT_REMOVED}"
        raise SettingsError(msg)
    _dataclass_init(self, *args, **kwargs)


RuntimeSettings.__init__ = _init  # type: ignore[method-assign]

#: why ``RuntimeSettings(columnar_input=...)`` is refused
COLUMNAR_INPUT_REMOVED = (
    "the setting was removed. A columnar computation reads the records its producer keyed from "
    "the micro-batch's files, and reads rows only where it must (declared fields, the keying "
    "stage); every record as a row was never faster (0.44x of native against 0.51x with "
    "exactly-once, level without; docs/performance.md). To bound what one batch decodes, set "
    "max_files_per_trigger instead. Remove the argument"
)
#: ``RuntimeSettings.outbox_writer`` values, and ``log_reader``'s
OUTBOX_WRITERS = ("auto", "driver", "spark")
#: ``RuntimeSettings.state_layout`` values, as strings
STATE_LAYOUTS = tuple(s.value for s in StateLayout)


#: a computation's wait between two looks at its inputs that found nothing, in a live run
#: (Spark's ``spark.sql.streaming.pollingDelay`` default) and on finite input
LIVE_POLL_MS, FINITE_POLL_MS = 10, 100


def resolved_computation_poll_ms(settings: RuntimeSettings, sources: list[Any]) -> int:
    """``settings.computation_poll_ms``, or for ``None`` :data:`FINITE_POLL_MS` when the input
    is finite (every injector's source ends by itself) and :data:`LIVE_POLL_MS` otherwise.
    ``sources``: each injector's source (``None`` for one fed from outside).

    >>> from millwheel import LogFileSource, SampleSource
    >>> resolved_computation_poll_ms(RuntimeSettings(), [LogFileSource("d", finite=True), SampleSource([])])
    100
    >>> resolved_computation_poll_ms(RuntimeSettings(), [LogFileSource("d"), SampleSource([])])
    10
    >>> resolved_computation_poll_ms(RuntimeSettings(drain=True), [LogFileSource("d"), None])
    10
    >>> resolved_computation_poll_ms(RuntimeSettings(computation_poll_ms=0), [SampleSource([])])
    0
    """
    from millwheel._logfile import LogFileSource
    from millwheel._sources import SampleSource

    if settings.computation_poll_ms is not None:
        return settings.computation_poll_ms

    def ends(source: Any) -> bool:
        if isinstance(source, LogFileSource):
            return source.read_options.finite
        return isinstance(source, SampleSource)

    return FINITE_POLL_MS if all(ends(s) for s in sources) else LIVE_POLL_MS
