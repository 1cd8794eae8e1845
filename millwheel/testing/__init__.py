"""``millwheel.testing``: unit-test computations and topologies in memory.

See :class:`Harness` (:meth:`Harness.run` returns a :class:`RunResult`); it runs the same per-key step as the Spark runtime.
"""

from millwheel.testing._harness import Harness
from millwheel.testing._result import RunResult
from millwheel.testing._rounds import Crash

__all__ = ["Crash", "Harness", "RunResult"]
