"""``millwheel.testing``: unit-test computations and topologies in memory.

See :class:`Harness`; it runs the same per-key step as the Spark runtime.
"""

from millwheel.testing._harness import Crash, Harness

__all__ = ["Crash", "Harness"]
