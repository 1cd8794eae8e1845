"""Per-record computations on interval rows: the default plan (``docs/runtime.md``, "Plans").

::

    query_inputs (heartbeats + every record a row) ─► groupBy(group of interval)
        ─► applyInPandasWithState(IntervalStep, NoTimeout) ─► foreachBatch(Outbox.sink)

The interval's ``GroupState`` row is ``(envs, meta)``: key -> envelope and key ->
:class:`~millwheel.runtime._interval.KeyMeta` (only keys that have one), msgpack. A batch
decodes the map once, steps the keys that have input or due timers
(:class:`~millwheel.runtime._interval.IntervalBatch`) and re-encodes it: envelopes of
untouched keys stay opaque bytes, so they cost a copy, not a decode, and a batch's cost
grows with the keys an interval *holds*. Its state store is Spark's default (HDFS-backed)
provider. :class:`IntervalStep` is also the owner the other interval plans' batches run
under (``keys.py`` borrows it, ``_columnar.ColumnarIntervalStep`` extends it).

The operator runs without Spark's timeouts: every timer fires from a heartbeat row or a
tick addressed to its interval (``docs/runtime.md``, "Heartbeats in the batch that reads
them"), and a timeout costs every task a second Python runner for the groups it timed out,
even when there are none. State that a query with ``EventTimeTimeout`` wrote (its rows carry
Spark's timeout column) keeps that setting, since Spark refuses another over it
(:func:`~millwheel.runtime._spark_internals.interval_state_timeouts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import msgpack
import pandas as pd

from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._step import StepRunner
from millwheel._topology import ComputationSpec
from millwheel.runtime._fieldcols import output_schema
from millwheel.runtime._interval import IntervalBatch, KeyMeta, earliest, unpack_meta
from millwheel.runtime._keying import Keyer
from millwheel.runtime._move import RescaleMismatch, install_envelopes, retire_group
from millwheel.runtime._spark_internals import interval_state_timeouts
from millwheel.runtime._wire import OUT_SCHEMA, timer_timeout
from millwheel.runtime.plans._base import Built, QueryInputs, apply_in_pandas
from millwheel.runtime.plans._choice import PlanKind

__all__ = ["IntervalRowsPlan", "IntervalStep", "store_interval"]

_packb = msgpack.packb
_unpackb = msgpack.unpackb


class IntervalRowsPlan:
    """:attr:`PlanKind.INTERVAL_ROWS`: a per-record computation, one state row per key interval."""

    kind: ClassVar[PlanKind] = PlanKind.INTERVAL_ROWS
    state_store_conf: ClassVar[dict[str, str]] = {}
    takes_markers: ClassVar[bool] = False
    narrows_to_markers: ClassVar[bool] = False
    marks_in_tasks: ClassVar[bool] = False
    addresses_heartbeats: ClassVar[bool] = True
    timers_in_no_data_batches: ClassVar[bool] = False

    def __init__(self, query: Any, pin: dict[str, Any]) -> None:
        self.query = query

    def step_args(self) -> dict[str, Any]:
        """What an interval step of the query is made with (``_runtime.pin_groups``: its groups)."""
        rt = self.query.rt
        return {
            "pipeline": rt.pipeline_id,
            "registry": rt.settings.registry,
            "keyer": rt.keyer,
            "groups": self.query.groups,
        }

    def timeouts(self) -> bool:
        """Whether the query runs with Spark's event-time timeout: only over interval rows
        written by a query that had it (their schema has its column); new state has none."""
        return interval_state_timeouts(self.query.checkpoint) is True

    def build(self, inputs: QueryInputs) -> Built:
        step = IntervalStep(self.query.spec, **self.step_args(), timeouts=self.timeouts())
        return Built(apply_in_pandas(inputs.union, step), self.query.outbox.sink)


class IntervalStep:
    """The ``applyInPandasWithState`` function of one computation: the interval-row layout.

    Picklable; builds its :class:`StepRunner` (and IdRegistry client) lazily, once per
    Python worker. The interval's GroupState row is ``(envs, meta)``: key -> envelope and
    key -> :class:`KeyMeta` (only keys that have one), msgpack.
    With a :class:`~millwheel.runtime._keying.Keyer`, its output rows carry the key columns
    of every consumer of its output streams (:meth:`out_schema`).
    """

    def __init__(
        self,
        spec: ComputationSpec,
        *,
        pipeline: str = "default",
        registry: Callable[[], Any] | None = None,
        keyer: Keyer | None = None,
        groups: Sequence[int] | None = None,
        timeouts: bool = True,
    ) -> None:
        self.spec = spec
        #: whether its operator runs with Spark's ``EventTimeTimeout``: then each interval's
        #: timeout is set at its earliest low-watermark timer (:func:`store_interval`)
        self.timeouts = timeouts
        #: the Spark grouping value of each key interval (``_runtime.pin_groups``; ``None``: the interval number)
        self.groups = None if groups is None else list(groups)
        #: how many key intervals (for rows keyed in the step: :meth:`IntervalBatch._key_here`)
        self.intervals = None if groups is None else len(groups)
        self._interval_of = None if groups is None else {g: i for i, g in enumerate(groups)}
        self.pipeline = pipeline
        #: a picklable factory of the IdRegistry client that ``once_id`` productions commit to
        self.registry_factory = registry
        self.keyer = keyer
        #: the consumers its output rows are keyed for
        self.out_consumers = (
            [] if keyer is None else keyer.consumers_of([*spec.all_outputs, DEAD_LETTER_STREAM])
        )
        self.out_fields = (
            None if keyer is None else keyer.output_fields(spec.all_outputs)
        )  # its declared output stream
        self._runner: StepRunner | None = None
        self._registry: Any = None

    def out_schema(self) -> str:
        """The Spark schema of its output rows: :data:`OUT_SCHEMA` and the key columns."""
        extra = self.keyer.ddl(self.out_consumers) if self.keyer is not None else ""
        return output_schema(f"{OUT_SCHEMA}, {extra}" if extra else OUT_SCHEMA, self.out_fields)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "pipeline": self.pipeline,
            "registry": self.registry_factory,
            "keyer": self.keyer,
            "groups": self.groups,
            "timeouts": self.timeouts,
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            d["spec"],
            pipeline=d["pipeline"],
            registry=d["registry"],
            keyer=d["keyer"],
            groups=d.get("groups"),
            timeouts=d.get("timeouts", True),
        )

    def interval_of(self, group: int) -> int:
        """The key interval of Spark group ``group`` (negative: the heartbeat group)."""
        if group < 0 or self._interval_of is None:
            return group
        return self._interval_of[group]

    def retired(self, group: int) -> bool:
        """Is ``group`` a Spark group that is not one of this layout's key intervals (a group
        of the layout before a rescale: it only ever gets its :attr:`RowKind.RETIRE` row)?"""
        return group >= 0 and self._interval_of is not None and group not in self._interval_of

    def install(self, batch: IntervalBatch, envs: dict[bytes, Any], meta: dict[bytes, Any]) -> None:
        """A rescale's envelopes into this interval's (empty) maps, before any key runs (``_move.py``)."""
        opts = self.spec.options
        install_envelopes(
            self.spec.name,
            batch.interval,
            self.intervals or 0,
            batch.installs,
            envs,
            meta,
            KeyMeta.make,
            opts.dedup if opts.exactly_once else None,
        )

    def _retire(self, batch: IntervalBatch, state: Any) -> None:
        """Empty a group of the layout before a rescale, once its state is the one the rescale read (``_move.py``)."""
        retire_group(
            self.spec.name,
            self.intervals,
            batch.retire,
            bool(batch.per_key or batch.installs),
            state,
        )

    def registry(self) -> Any:
        if self._registry is None and self.registry_factory is not None:
            self._registry = self.registry_factory()
        return self._registry

    def runner(self) -> StepRunner:
        if self._runner is None:
            spec = self.spec
            # strong productions are checkpointed in the batch outbox, not in the envelope
            opts = dataclasses.replace(spec.options, strong_productions=False)
            self._runner = StepRunner(
                spec.instantiate(), name=spec.name, outputs=spec.all_outputs, options=opts
            )
        return self._runner

    def __call__(
        self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        batch = IntervalBatch.of(
            self, group, frames, state.getCurrentWatermarkMs(), state.getCurrentProcessingTimeMs()
        )
        if batch is None:
            return
        if self.retired(int(group[0])):
            self._retire(batch, state)
            return
        if batch.retire is not None:
            msg = f"computation {self.spec.name!r}: a rescale retires Spark group {group[0]}, which is key interval {batch.interval} of this layout"
            raise RescaleMismatch(msg)
        if state.exists:
            envs_b, meta_b = state.get
            envs = _unpackb(envs_b, raw=False, strict_map_key=False)
            meta = unpack_meta(meta_b)
        else:
            envs, meta = {}, {}
        if batch.installs:
            self.install(batch, envs, meta)
        batch.add_due(meta.items())
        for kb, outcome in batch.run(envs.get).items():
            if outcome.envelope is None:
                envs.pop(kb, None)
            else:
                envs[kb] = outcome.envelope
            m = KeyMeta.of(outcome)
            if m is None:
                meta.pop(kb, None)
            else:
                meta[kb] = m
        hold, nlw_min, nwall_min = store_interval(state, envs, meta, timeouts=self.timeouts)
        yield batch.summary(hold, nlw_min, nwall_min, len(envs))


def store_interval(
    state: Any, envs: dict[bytes, Any], meta: dict[bytes, Any], *, timeouts: bool = True
) -> tuple[int | None, int | None, int | None]:
    """Write an interval's maps into its ``GroupState`` row (or remove the row: no keys),
    with ``timeouts`` its event-time timeout at its earliest low-watermark timer; returns
    :func:`earliest`."""
    if envs:
        state.update((_packb(envs, use_bin_type=True), _packb(meta, use_bin_type=True)))
    elif state.exists:
        state.remove()
    hold, nlw_min, nwall_min = earliest(meta.values())
    if timeouts and nlw_min is not None and envs:
        state.setTimeoutTimestamp(max(timer_timeout(nlw_min), state.getCurrentWatermarkMs()))
    return hold, nlw_min, nwall_min
