"""The run's audit trail: what a checker needs to verify the watermark and timer guarantees afterwards.

Two append-only JSON-lines files under ``<run>/audit/``, written by the driver:

* ``watermarks.jsonl`` — every change of a published low watermark this driver read from
  the watermark authority: ``{"name", "lw", "t0", "t1", "pid"}``, where ``t0``/``t1`` are
  ``CLOCK_MONOTONIC`` nanoseconds just before the request and just after the answer
  (one clock for every process of the machine, untouched by wall-clock jumps). Two reads
  whose intervals do not overlap are ordered, so "a published low watermark never goes
  back" is checkable across drivers (§7.2).
* ``batches/<computation>.jsonl`` — one line per published micro-batch:
  ``{"batch", "lw", "fired", "epoch"}``: the low watermark the batch ran under (every key
  interval of a batch sees the same Spark watermark), how many low-watermark and wall
  timers it fired, and the lease epoch of the driver that published it. With the
  checkpoint's record of which input files each batch consumed, a checker finds a batch
  that fired timers under a watermark that input consumed later was behind (an early
  timer, §4.6).

A line is written with one ``write`` on a file opened for appending; a driver killed
mid-line leaves a partial last line, which readers skip (:func:`read_lines`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from millwheel.runtime._fs import Location

WATERMARKS = "watermarks.jsonl"
BATCHES = "batches"


class AuditLog:
    """Appends the audit lines of one driver (see the module docstring)."""

    def __init__(self, root: Location) -> None:
        self.loc = root.child("audit")
        self._seen: dict[str, int] = {}
        self._ready = False

    def _append(self, loc: Location, entry: dict[str, Any]) -> None:
        if not self._ready:
            self.loc.child(BATCHES).mkdirs()
            self._ready = True
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        if loc.fs.get_file_info(loc.path).type.name == "NotFound":
            with loc.fs.open_output_stream(loc.path) as f:
                f.write(line)
            return
        with loc.fs.open_append_stream(loc.path) as f:
            f.write(line)

    def watermark(self, name: str, read: Callable[[str], int]) -> int:
        """``read(name)``, recording the value if it changed since this driver last read it."""
        t0 = time.monotonic_ns()
        value = read(name)
        t1 = time.monotonic_ns()
        if self._seen.get(name) != value:
            self._seen[name] = value
            self._append(
                self.loc.child(WATERMARKS),
                {"name": name, "lw": value, "t0": t0, "t1": t1, "pid": os.getpid()},
            )
        return value

    def batch(
        self, computation: str, batch: int, low_watermark: int, fired: int, epoch: int
    ) -> None:
        entry = {"batch": batch, "lw": low_watermark, "fired": fired, "epoch": epoch}
        self._append(self.loc.child(BATCHES, f"{computation}.jsonl"), entry)


def read_lines(loc: Location) -> Iterator[dict[str, Any]]:
    """The complete lines of an audit file (a partial last line, from a kill, is skipped)."""
    text = loc.read_text() or ""
    for line in text.split("\n"):
        if not line:
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue
