"""What every peer job of ``bench/peers_bench.py`` shares: how it hands back its output.

A job writes the rows it emitted, ``key,window start (ms),count`` one a line in the order
it emitted them, then prints ``PEERS_DONE <unix time>``: the bench's clock stops there
(whole process: from the bench starting the process to its last output written; what
the process does after, a JVM's shutdown, is not counted). Plain Python: imported by
jobs in the project's virtualenv and in the peers' one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

#: the window of the windowed count, as ``bench/runtime_bench.py`` counts it
WINDOW_MS = 10_000


def finish(rows: Iterable[tuple[str, int, int]], out: str | Path) -> None:
    """Write ``rows`` to ``out`` and report the time the last output was written."""
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(f"{k},{int(w)},{int(c)}\n" for k, w, c in rows)
    print(f"PEERS_DONE {time.time():.6f}", flush=True)
