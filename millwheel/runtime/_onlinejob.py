"""One rescale of a running computation as its driver carries it out (``_online.OnlineRescaler``):
what was asked (a request, or an autoscale decision), which state it is in, when each began."""

from __future__ import annotations

import threading
import time
from typing import Any

from millwheel.runtime._autoscale import Decision
from millwheel.runtime._requests import what

__all__ = ["Job"]


class Job:
    """One rescale in the driver: a request (or an autoscale decision) and where it is."""

    def __init__(
        self,
        rid: str,
        computation: str,
        intervals: int | None,
        decision: Decision | None = None,
        layout: str | None = None,
    ) -> None:
        self.rid, self.computation, self.intervals, self.decision, self.layout = (
            rid,
            computation,
            intervals,
            decision,
            layout,
        )
        #: a layout change (``_relayout.py``: ``--layout``, or a per-key computation), decided at the first boundary
        self.relayout = False
        self.state = "waiting"  # waiting -> moving -> restarted -> done | failed
        self.detail = "waits for a committed batch boundary"
        self.at = {"requested": time.monotonic()}
        self.at_ms = int(time.time() * 1000)
        self.attempts = 0
        self.thread: threading.Thread | None = None
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.figures: dict[str, Any] = {}

    def text(self) -> str:
        how = f"{self.decision.action} " if self.decision else ""
        return f"rescale {how}{self.computation} -> {what(self.intervals, self.layout)}: {self.state} ({self.detail})"
