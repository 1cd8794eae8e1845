"""Per-record computations on per-key rows: the opt-in plan for very large key spaces
(``RuntimeSettings(state_layout="keys")``; ``docs/runtime.md``, "Plans").

::

    query_inputs (heartbeats + every record a row) ─► groupBy(group of interval)
        ─► transformWithStateInPandas(KeyRows, EventTime) ─► foreachBatch(Outbox.sink)

The default plan (:class:`~millwheel.runtime.plans.intervals.IntervalStep`) keeps one
GroupState row per key interval holding every envelope of the interval: a batch rewrites
every *held* key of every interval it touches. MillWheel keeps per-key rows in Bigtable
(§7.1): a batch should cost what it touches. This layout gets there with Spark's
``transformWithStateInPandas`` (RocksDB state store), grouped by the same key intervals:

* ``envs`` — a MapState of key -> envelope, one state-store row per key: a batch reads and
  writes only the keys it steps;
* ``meta`` — a ValueState per interval: how many keys keep anything, and
  ``key -> [hold, next low-watermark timer, next wall timer]`` for the keys that have one
  (what the interval summary and the due-timer check need, without reading envelopes);
* ``timer`` — the interval's registered event-time timer: its earliest low-watermark
  timer, so Spark calls the interval when the heartbeat watermark passes it (§4.6).

The per-key step, the grouping by key, send order, step plans and outputs are the same
code as the default layout (:class:`~millwheel.runtime._interval.IntervalBatch`); only
where envelopes come from and go to differs. State, timers and dedup ids still commit
with Spark's state store at the end of the micro-batch (§6.2).

**Round trips.** Every state call of ``transformWithStateInPandas`` is a request to a
state server in the JVM over a socket, answered in order; one call per key per read and
per write would pay a round trip each (measured ~0.3-0.7 ms on the 2-core machine, see
``docs/performance.md``). :class:`~millwheel.runtime._spark_internals.MapStatePipeline` writes a chunk of requests before reading
their answers, so a batch pays one round trip per chunk. It uses the request and answer
encoding of PySpark's own state client (``StatefulProcessorApiClient``), which
``pyspark==4.3.0`` pins.

**Limits.** ``meta`` holds an entry for every key with a pending timer or hold, and is
rewritten when one changes: a batch costs the keys it touches plus ~30 bytes per key
with pending timers in the interval. Keys that only keep state (and dedup ids) cost
nothing until touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import msgpack
import pandas as pd

from millwheel._topology import ComputationSpec
from millwheel.runtime._interval import IntervalBatch, KeyMeta, earliest, unpack_meta
from millwheel.runtime._move import RescaleMismatch, install_envelopes
from millwheel.runtime._spark_internals import MapStatePipeline
from millwheel.runtime._wire import to_spark
from millwheel.runtime.plans._base import Built, QueryInputs
from millwheel.runtime.plans._choice import PlanKind
from millwheel.runtime.plans.intervals import IntervalRowsPlan, IntervalStep

__all__ = ["KeyRowsPlan", "make_processor", "schedule", "state_variables"]

_packb = msgpack.packb
_unpackb = msgpack.unpackb


class KeyRowsPlan:
    """:attr:`PlanKind.KEY_ROWS`: a per-record computation, one state-store row per key."""

    kind: ClassVar[PlanKind] = PlanKind.KEY_ROWS
    # transformWithState needs the RocksDB provider; changelog checkpointing makes a
    # commit write the rows a batch changed, not a snapshot of the store
    state_store_conf: ClassVar[dict[str, str]] = {
        "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    takes_markers: ClassVar[bool] = False
    narrows_to_markers: ClassVar[bool] = False
    marks_in_tasks: ClassVar[bool] = False
    addresses_heartbeats: ClassVar[bool] = False
    timers_in_no_data_batches: ClassVar[bool] = True

    def __init__(self, query: Any, pin: dict[str, Any]) -> None:
        self.query = query

    def build(self, inputs: QueryInputs) -> Built:
        processor = make_processor(self.query.spec, **IntervalRowsPlan(self.query, {}).step_args())
        out = inputs.union.groupBy("group").transformWithStateInPandas(
            statefulProcessor=processor,
            outputStructType=processor.owner.out_schema(),
            outputMode="Append",
            timeMode="EventTime",
        )
        return Built(out, self.query.outbox.sink)


ENVS_KEY_SCHEMA = "key binary"
ENVS_VALUE_SCHEMA = "env binary"
META_SCHEMA = "meta binary"
TIMER_SCHEMA = "ts long"


def schedule(handle: Any, timer: Any, nlw_min: int | None, watermark: int, expired: bool) -> None:
    """Keep one event-time timer per interval (``timer``: its ValueState), at its earliest
    low-watermark timer.

    A timer at ``ts`` is due once the low watermark reaches it (§4.6); Spark fires a
    registered timer once the watermark reaches its time, so it is registered at
    ``to_spark(ts)``, and never at or below the current watermark (Spark deletes
    the timer it has just fired after this call).
    """
    current = timer.get()
    stored = None if current is None else current[0]
    live = None if stored is None or (expired and stored <= watermark) else stored
    want = None if nlw_min is None else max(to_spark(nlw_min), watermark + 1)
    if want != live:
        if live is not None:
            handle.deleteTimer(live)
        if want is not None:
            handle.registerTimer(want)
    if want != stored:
        if want is None:
            timer.clear()
        else:
            timer.update((want,))


def state_variables(handle: Any) -> tuple[Any, Any, Any]:
    """The layout's state variables of one interval: ``envs``, ``meta``, ``timer`` (see the module docstring)."""
    return (
        handle.getMapState("envs", ENVS_KEY_SCHEMA, ENVS_VALUE_SCHEMA),
        handle.getValueState("meta", META_SCHEMA),
        handle.getValueState("timer", TIMER_SCHEMA),
    )


def make_processor(
    spec: ComputationSpec,
    *,
    pipeline: str = "default",
    registry: Any = None,
    keyer: Any = None,
    groups: Any = None,
) -> Any:
    """The ``StatefulProcessor`` of one computation in the per-key layout."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class KeyRows(StatefulProcessor):  # type: ignore[misc]
        """One computation's key intervals, with one state-store row per key."""

        def __init__(self) -> None:
            self.owner = IntervalStep(
                spec, pipeline=pipeline, registry=registry, keyer=keyer, groups=groups
            )

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.envs, self.meta, self.timer = state_variables(handle)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            watermark = timerValues.getCurrentWatermarkInMs()
            batch = IntervalBatch.of(
                self.owner, key, rows, watermark, timerValues.getCurrentProcessingTimeInMs()
            )
            if batch is not None and (batch.retire is not None or batch.interval == -2):
                msg = f"computation {spec.name!r}: a rescale's rows reached the per-key state layout, which millwheel rescale does not move"
                raise RescaleMismatch(msg)
            if batch is not None:
                yield self._run(batch, watermark, expired=False)

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[pd.DataFrame]:
            watermark = timerValues.getCurrentWatermarkInMs()
            batch = IntervalBatch.of(
                self.owner, key, (), watermark, timerValues.getCurrentProcessingTimeInMs()
            )
            if batch is not None:
                yield self._run(batch, watermark, expired=True)

        def _run(self, batch: IntervalBatch, watermark: int, expired: bool) -> pd.DataFrame:
            stored = self.meta.get()
            count, meta = (0, {}) if stored is None else unpack_meta(stored[0])
            envs = MapStatePipeline(self.envs)
            # a state load's envelopes (``_state_load.py``), before any key runs
            installed = self._install(batch, envs, count, meta) if batch.installs else {}
            batch.add_due(meta.items())
            keys = list(batch.per_key)
            fetch = [kb for kb in keys if kb not in installed]
            before = envs.get_many(fetch) if fetch else {}
            before.update((kb, installed[kb]) for kb in keys if kb in installed)
            outcomes = batch.run(before.__getitem__)
            updates: list[tuple[bytes, bytes]] = []
            removals: list[bytes] = []
            kept = count + len(installed)
            changed = bool(installed)
            for kb, outcome in outcomes.items():
                env, old = outcome.envelope, before[kb]
                if env is None:
                    if old is not None:
                        removals.append(kb)
                        kept -= 1
                else:
                    if env != old:
                        updates.append((kb, env))
                    if old is None:
                        kept += 1
                m = KeyMeta.of(outcome)
                if m is None:
                    changed |= meta.pop(kb, None) is not None
                elif meta.get(kb) != m:
                    meta[kb] = m
                    changed = True
            if updates or removals:
                envs.write_many(updates, removals)
            if changed or kept != count:
                if kept or meta:
                    self.meta.update((_packb([kept, meta], use_bin_type=True),))
                else:
                    self.meta.clear()
            hold, nlw_min, nwall_min = earliest(meta.values())
            schedule(self.handle, self.timer, nlw_min, watermark, expired)
            return batch.summary(hold, nlw_min, nwall_min, kept)

        def _install(
            self, batch: IntervalBatch, envs: Any, count: int, meta: dict[bytes, Any]
        ) -> dict[bytes, bytes]:
            """A state load's envelopes into this (empty) interval, one row per key (``_move.py``)."""
            if count or meta:
                msg = f"computation {spec.name!r}: a state load installs envelopes into key interval {batch.interval}, which already holds {count} keys"
                raise RescaleMismatch(msg)
            installed: dict[bytes, bytes] = {}
            install_envelopes(
                spec.name,
                batch.interval,
                self.owner.intervals or 0,
                batch.installs,
                installed,
                meta,
                KeyMeta.make,
                spec.options.dedup if spec.options.exactly_once else None,
            )
            envs.write_many(list(installed.items()), [])
            return installed

        def close(self) -> None:
            pass

    return KeyRows()
