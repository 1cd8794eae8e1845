"""millwheel's pytest plugin: a ``harness`` fixture, so a computation's test is only the test.

Installed with millwheel (entry point ``pytest11``), so any project that depends on
millwheel has it without a ``conftest.py``::

    from computations.windowing import WindowCounter

    def test_counts_per_window(harness):
        h = harness(WindowCounter, inputs={"queries": lambda r: r.value["query"]}, outputs=["window_counts"])
        h.inject("queries", [h.record({"query": "cats"}, 1_100), h.record({"query": "cats"}, 1_900)])
        h.advance_watermark("queries", 2_000)
        h.run()
        assert h.values("window_counts")[0]["count"] == 2

``harness(...)`` builds a :class:`~millwheel.testing.Harness` from

* a :class:`~millwheel.Computation` subclass and the keyword arguments of
  :meth:`Harness.for_computation <millwheel.testing.Harness.for_computation>` (``inputs``,
  ``outputs``, ``options``, ``params``, ...): one computation, an injector per input stream;
* a :class:`~millwheel.Topology`;
* a path to a topology module (a ``.py`` file or a package directory), as ``millwheel run`` takes it.

User code raises in the test (``raise_errors=True``) unless the test asks for dead
letters with ``raise_errors=False``; ``wall_time=`` starts the harness clock elsewhere than 0.
The fixture imports no pyspark.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from millwheel._computation import Computation
from millwheel._errors import MillwheelError
from millwheel._topology import Topology
from millwheel.testing._harness import Harness


class HarnessFactory:
    """What the ``harness`` fixture gives a test: call it to get a :class:`Harness`."""

    def __init__(self) -> None:
        #: every harness this test built, in order
        self.built: list[Harness] = []

    def __call__(self, target: Any, /, **kwargs: Any) -> Harness:
        if isinstance(target, type) and issubclass(target, Computation):
            h = Harness.for_computation(target, **kwargs)
        elif isinstance(target, Topology):
            h = Harness(target, **kwargs)
        elif isinstance(target, (str, os.PathLike)):
            from millwheel._runner import load_topology

            h = Harness(load_topology(os.fspath(target)), **kwargs)
        else:
            msg = (
                f"harness() takes a Computation subclass (with inputs=..., outputs=...), a Topology or the path of a "
                f"topology module; got {type(target).__name__}: {target!r}"
            )
            raise MillwheelError(msg)
        self.built.append(h)
        return h


@pytest.fixture
def harness() -> HarnessFactory:
    """Build an in-memory :class:`~millwheel.testing.Harness`: ``harness(MyComputation, inputs=..., outputs=...)``,
    ``harness(topology)`` or ``harness("path/to/topology.py")``."""
    return HarnessFactory()
