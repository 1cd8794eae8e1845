"""Time in the authority: int milliseconds since the epoch, and the two ends of time.

The authority defines these itself (they equal ``millwheel.MIN_TIMESTAMP`` and
``millwheel.MAX_TIMESTAMP``, which a test checks) so that the service imports nothing
from the user API.
"""

from __future__ import annotations

import time

#: "nothing known": an interval acquired but never reported, an expected process that has not reported
MIN_TIMESTAMP = -(2**63)
#: "finished": no work left, and there never will be
MAX_TIMESTAMP = 2**63 - 1


def wall_ms() -> int:
    """Wall time in integer milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
