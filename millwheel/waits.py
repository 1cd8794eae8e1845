"""What a run is waiting on (a dependency that is out, and since when): the wait board's public names.

* :class:`WaitBoard` — where a process says it waits on a dependency (``waiting``) and that
  the dependency answered again (``done``);
* :func:`read_waits` — the waits on a board (a run directory's :data:`WAITS`), without stale
  ones; :class:`Wait` — one of them (``text()``: what the live status shows).

See ``millwheel/_waits.py`` and ``docs/reliability.md`` ("Outages of a dependency").
"""

from millwheel._waits import STALE_MS, WAITS, Wait, WaitBoard, read_waits

__all__ = ["STALE_MS", "WAITS", "Wait", "WaitBoard", "read_waits"]
