"""Columnar computations on interval rows, their records read from the batch's files
(``docs/runtime.md``, "Plans", "A columnar computation reads its records from the batch's files").

::

    query_inputs (heartbeats + one marker row per group and task for an input its producer
                  keyed; rows for the others) ─► groupBy(group of interval)
        ─► applyInPandasWithState(ColumnarIntervalStep, NoTimeout) ─► foreachBatch(Outbox.sink)

The same operator, state row and timeout setting as ``intervals.py``; the row holds the
interval's columnar store (``_columnar.py``), its held dedup ids in segment files beside
the state (``<checkpoint>/ids/i<interval>/``, ``_colsegments.py``). The step reads a marked
interval's records from the micro-batch's files (``_scan.BatchScan``); inputs read as rows
(declared fields, the keying stage) reach it as rows, and a checkpoint resumes under either.
"""

from __future__ import annotations

from typing import ClassVar

from millwheel.runtime._columnar import ColumnarIntervalStep
from millwheel.runtime.plans._base import Built, QueryInputs, apply_in_pandas
from millwheel.runtime.plans._choice import PlanKind
from millwheel.runtime.plans.intervals import IntervalRowsPlan

__all__ = ["ColumnarPlan"]


class ColumnarPlan(IntervalRowsPlan):
    """:attr:`PlanKind.COLUMNAR`: a columnar computation, one state row per key interval."""

    kind: ClassVar[PlanKind] = PlanKind.COLUMNAR
    takes_markers: ClassVar[bool] = True
    narrows_to_markers: ClassVar[bool] = True
    #: ``applyInPandasWithState`` calls a group only for its rows: a marker is one
    marks_in_tasks: ClassVar[bool] = False

    def build(self, inputs: QueryInputs) -> Built:
        query = self.query
        step = ColumnarIntervalStep(query.spec, **self.step_args(), timeouts=self.timeouts())
        step.scan = inputs.scan
        step.ids_beside(query.checkpoint.child("ids").uri, query.rt.spark)
        return Built(apply_in_pandas(inputs.union, step), query.outbox.sink)
