"""What a plan gives :class:`~millwheel.runtime._query.ComputationQuery` (``docs/runtime.md``, "Plans")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from millwheel.runtime._scan import BatchScan, ScannedInput
from millwheel.runtime.plans._choice import PlanKind

__all__ = ["Built", "Plan", "QueryInputs", "apply_in_pandas"]


@dataclass(frozen=True)
class QueryInputs:
    """The query's input, as every plan gets it (``plans/_inputs.py``)."""

    #: heartbeats, ticks, a rescale's rows and the input rows (or markers), with Spark's
    #: event-time watermark on ``wm_ts``; grouped by ``group`` (the key interval's Spark group)
    union: Any
    #: how the step reads the records of the inputs read from the batch's files (``None``: none is)
    scan: BatchScan | None
    #: those inputs
    scanned: tuple[ScannedInput, ...]
    #: whether Spark lists the heartbeat source before every input when it plans a batch, and
    #: takes every file it lists: a heartbeat may then count files no batch planned yet
    #: (``_consumed.input_watermarks``, :func:`~millwheel.runtime.plans._inputs.heartbeats_listed_first`)
    listed_first: bool = False
    #: whether Spark reads the records of some input as rows (the keying stage, declared
    #: fields, a plan that scans its inputs' interval column); if not, the union holds only
    #: the heartbeat source's rows (a plan whose tasks find their records in the batch's files)
    rows: bool = True


@dataclass(frozen=True)
class Built:
    """A plan's streaming frame and the ``foreachBatch`` sink its micro-batches go to."""

    out: Any
    sink: Callable[[Any, int], None]


class Plan(Protocol):
    """One physical plan of a computation's query: ``plans/intervals.py``, ``keys.py``,
    ``columnar.py``, ``arrow.py``. Built per query start by :func:`~millwheel.runtime.plans.plan_for`
    with the query and its mapping's ``run.json`` pin."""

    kind: ClassVar[PlanKind]
    #: the Spark configuration of its state store (the checkpoint pins the provider from its first start)
    state_store_conf: ClassVar[Mapping[str, str]]
    #: whether an input its producer keyed reaches it as marker rows, its records read by the
    #: step from the micro-batch's files (``_scan.py``); otherwise every record is a row
    takes_markers: ClassVar[bool]
    #: whether a query whose every input is read from the files passes its operator only
    #: ``_scan.SCAN_ONLY_COLUMNS`` (a plan whose tasks select their columns themselves: no)
    narrows_to_markers: ClassVar[bool]
    #: whether its tasks find the key intervals with records in the micro-batch's files
    #: themselves (``_scan.batch_intervals``), so Spark reads none of those inputs' rows: their
    #: file sources stay in the plan, whose offsets name the batch's files
    marks_in_tasks: ClassVar[bool]
    #: whether a heartbeat reaches its key intervals' groups as rows of their own, its watermark
    #: applied in the batch that reads it (``IntervalBatch.take_ticks``), so that the query
    #: runs no no-data batches (``docs/runtime.md``, "Heartbeats in the batch that reads them")
    addresses_heartbeats: ClassVar[bool]
    #: whether its low-watermark timers fire in Spark's no-data batches, run when only
    #: Spark's watermark moved (a stateful operator's event-time timers: the per-key plan);
    #: otherwise the driver ticks the intervals whose wake-ups the watermark passed
    #: (``_wire.due_ticks``)
    timers_in_no_data_batches: ClassVar[bool]

    def __init__(self, query: Any, pin: dict[str, Any]) -> None:
        """``query``: its ``ComputationQuery``; ``pin``: its mapping's ``run.json`` entry."""
        ...

    def build(self, inputs: QueryInputs) -> Built:
        """The query's stateful part over ``inputs``, and its sink."""
        ...


def apply_in_pandas(union: Any, step: Any) -> Any:
    """``applyInPandasWithState`` of ``step`` over the key intervals' groups: the interval-row
    plans (the interval's ``GroupState`` row, ``_wire.STATE_SCHEMA``; Spark's event-time
    timeout only if ``step.timeouts``: ``plans/intervals.py``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    from millwheel.runtime._wire import STATE_SCHEMA

    timeout = GroupStateTimeout.EventTimeTimeout if step.timeouts else GroupStateTimeout.NoTimeout
    return union.groupBy("group").applyInPandasWithState(
        step, step.out_schema(), STATE_SCHEMA, "append", timeout
    )
