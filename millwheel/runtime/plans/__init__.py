"""The physical plans of a computation's Spark query, behind one seam (``docs/runtime.md``, "Plans").

:class:`~millwheel.runtime._query.ComputationQuery` owns what every computation has — its
lease, outbox, heartbeats, low watermark, restarts — and asks its plan for the rest:

* ``_choice.py`` — :func:`choose_plan`: which plan, from the computation's kind, mapping
  and state layout; every combination the runtime cannot run is refused there.
* ``_base.py`` — the :class:`Plan` protocol: its state store's Spark configuration,
  whether it takes the scan's markers, and ``build(inputs) -> Built`` (its frame and sink).
* ``_inputs.py`` — the union of heartbeats and inputs every plan starts from.
* ``intervals.py`` — per-record, one ``applyInPandasWithState`` row per key interval (default).
* ``keys.py`` — per-record, one state-store row per key (``transformWithStateInPandas``).
* ``columnar.py`` — columnar, interval rows, records read from the batch's files.
* ``arrow.py`` — columnar on the Arrow mapping, state in versioned files.

"""

from __future__ import annotations

from typing import Any

from millwheel._options import Mapping
from millwheel.runtime._settings import StateLayout
from millwheel.runtime.plans._base import Built, Plan, QueryInputs
from millwheel.runtime.plans._choice import PlanKind, choose_plan
from millwheel.runtime.plans.intervals import IntervalRowsPlan
from millwheel.runtime.plans.keys import KeyRowsPlan

__all__ = [
    "STATE_STORE_CONF",
    "Built",
    "Plan",
    "PlanKind",
    "QueryInputs",
    "choose_plan",
    "plan_class",
    "plan_for",
]

#: the Spark configuration of each state layout's state store: the per-record plans' (a
#: layout change's install query, ``_relayout.py``, starts with its target layout's)
STATE_STORE_CONF: dict[str, dict[str, str]] = {
    StateLayout.INTERVALS.value: dict(IntervalRowsPlan.state_store_conf),
    StateLayout.KEYS.value: dict(KeyRowsPlan.state_store_conf),
}

#: where each plan's class is; the columnar plans' modules import the columnar step, which
#: imports ``intervals.py``: they are imported when a plan is built
_CLASSES = {
    PlanKind.INTERVAL_ROWS: ("intervals", "IntervalRowsPlan"),
    PlanKind.KEY_ROWS: ("keys", "KeyRowsPlan"),
    PlanKind.COLUMNAR: ("columnar", "ColumnarPlan"),
    PlanKind.ARROW: ("arrow", "ArrowPlan"),
}


def plan_class(kind: PlanKind) -> type[Plan]:
    """The class of plan ``kind``."""
    import importlib

    module, name = _CLASSES[kind]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def plan_for(query: Any, layout: Any) -> Plan:
    """The plan of ``query``'s computation under ``layout`` (``_layout.Layout``, read at each
    start): chosen (and refused) by :func:`choose_plan`, its mapping pinned in ``run.json``
    (``_colfiles.pin_mapping``: a run directory keeps the mapping it started with)."""
    from millwheel.runtime._colfiles import pin_mapping
    from millwheel.runtime._spark_internals import has_started

    rt, spec = query.rt, query.spec
    speculation = rt.spark.sparkContext.getConf().get("spark.speculation", "false")
    kind = choose_plan(
        spec,
        layout.state_layout,
        rescaled=layout.own,
        speculation=str(speculation).lower() == "true",
    )
    pin = pin_mapping(
        rt.root,
        spec.name,
        Mapping.parse(spec.options.mapping).value,
        has_started(query.checkpoint),
        int(rt.spark.conf.get("spark.sql.shuffle.partitions")),
    )
    return plan_class(kind)(query, pin)
