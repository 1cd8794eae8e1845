"""Which plan runs a computation: resolved and validated in one place (``docs/runtime.md``, "Plans").

Three things decide it: the computation's kind (per-record :class:`~millwheel.Computation`
or :class:`~millwheel.ColumnarComputation`), its :class:`~millwheel._options.Mapping`
(``ComputationOptions.mapping``) and its :class:`~millwheel.runtime._settings.StateLayout`
(``RuntimeSettings.state_layout``, or its own from ``run.json`` after ``millwheel rescale
--layout``). :func:`choose_plan` turns them into a :class:`PlanKind`, and every combination
the runtime cannot run is refused there, before the query starts:

=====================  ===================  ==================  ==========================
kind                   mapping              state layout        plan
=====================  ===================  ==================  ==========================
per record             default              intervals           :attr:`PlanKind.INTERVAL_ROWS`
per record             default              keys                :attr:`PlanKind.KEY_ROWS`
columnar               default              intervals           :attr:`PlanKind.COLUMNAR`
columnar               arrow                intervals           :attr:`PlanKind.ARROW`
per record             arrow                any                 refused (:class:`TopologyError`)
columnar               any                  keys                refused (:class:`SettingsError`)
=====================  ===================  ==================  ==========================

The Arrow mapping is refused too on a rescaled computation (its state is not in Spark's
state store, which ``millwheel rescale`` moves) and on a session with
``spark.speculation=true``.
"""

from __future__ import annotations

import enum

from millwheel._columnar import is_columnar
from millwheel._errors import RunError
from millwheel._options import Mapping
from millwheel._topology import ComputationSpec, check_mapping
from millwheel.runtime._settings import SettingsError, StateLayout

__all__ = ["PlanKind", "choose_plan"]


class PlanKind(enum.Enum):
    """The physical plans of a computation's query (``millwheel/runtime/plans/``)."""

    #: per-record computation, one ``applyInPandasWithState`` row per key interval (``intervals.py``)
    INTERVAL_ROWS = "interval rows"
    #: per-record computation, one state-store row per key (``keys.py``)
    KEY_ROWS = "key rows"
    #: columnar computation on interval rows, records read from the batch's files (``columnar.py``)
    COLUMNAR = "columnar"
    #: columnar computation on the Arrow mapping, state in versioned files (``arrow.py``)
    ARROW = "arrow"


def choose_plan(
    spec: ComputationSpec,
    state_layout: StateLayout | str,
    *,
    rescaled: bool = False,
    speculation: bool = False,
) -> PlanKind:
    """The plan of ``spec``'s query under ``state_layout``; every refusal of a combination
    the runtime cannot run is here (see the module docstring).

    ``rescaled``: the computation has a layout of its own from ``millwheel rescale``;
    ``speculation``: the Spark session runs with ``spark.speculation=true``.
    """
    name, mapping = spec.name, Mapping.parse(spec.options.mapping)
    layout = StateLayout.parse(state_layout)
    columnar = is_columnar(spec.cls)
    check_mapping(name, spec.cls, mapping)
    if mapping is Mapping.ARROW:
        arrow = f"computation {name!r} runs on the Arrow mapping (ComputationOptions(mapping='arrow')), but"
        if layout is not StateLayout.INTERVALS:
            msg = f"{arrow} it needs the interval layout (RuntimeSettings(state_layout='intervals')), not {layout.value!r}"
            raise SettingsError(msg)
        if rescaled:
            msg = f"{arrow} it was rescaled (millwheel rescale moves state kept by Spark's state store, which this mapping does not use)"
            raise RunError(msg)
        if speculation:
            msg = (
                f"{arrow} the session runs with spark.speculation=true: a speculative copy of a task would write a second "
                "version of its key intervals' state; start the session with speculation off"
            )
            raise SettingsError(msg)
        return PlanKind.ARROW
    if columnar:
        if layout is not StateLayout.INTERVALS:
            msg = (
                f"computation {name!r} is columnar ({spec.cls.__name__}): it runs on the interval-row layout only; "
                f"use RuntimeSettings(state_layout='intervals'), not {layout.value!r}"
            )
            raise SettingsError(msg)
        return PlanKind.COLUMNAR
    return PlanKind.KEY_ROWS if layout is StateLayout.KEYS else PlanKind.INTERVAL_ROWS
