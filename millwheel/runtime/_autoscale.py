"""The automatic rescale policy: when to split or merge a computation's key intervals (§7.1).

MillWheel's master, "in response to increased CPU load or memory pressure (reported by a
standard per-process monitor), can move these intervals around, split them, or merge
them" (§7.1). Here the figures are each key interval's, from its batch summary
(``_wire.IntervalSummary``): ``step_ms``, how long its share of a micro-batch took in its
worker, and ``keys``, how many keys it holds. :func:`decide` is a pure function of the
last batches' figures, so it is tested without Spark (``tests/runtime/test_autoscale.py``);
``_online.py`` feeds it each published batch and carries out what it decides with an
online rescale, when ``millwheel run --autoscale`` (``RuntimeSettings.autoscale``) asks.

* **Split** (double the intervals) when, in each of the last ``window`` batches, some
  interval's step time is at least ``hot_ratio`` times the median interval's and at least
  ``min_hot_ms`` — or its keys at least ``hot_ratio`` times the median and at least
  ``min_hot_keys``. A hot interval holds several keys (a hash range): doubling the count
  halves each range, and the keys that made it hot are spread over two groups, which
  Spark's shuffle partitions can run in parallel.
* **Merge** (halve them) when, in each of the last ``window`` batches, every interval is
  cold: its step time under ``cold_ms`` and its keys under ``cold_keys``. Fewer intervals
  cost less per batch (one group, one state row, one summary each).
* **Hysteresis**: the thresholds for hot and cold are far apart (``cold_ms`` well under
  ``min_hot_ms``), a condition must hold for ``window`` batches in a row, and after a
  change nothing is decided for ``cooldown_s`` seconds nor before ``window`` batches of
  the new layout have been seen (the batches before the change are forgotten).
* **Bounds**: never above ``max_intervals`` nor below ``min_intervals``.

>>> hot = [{0: Figures(400, 10), 1: Figures(20, 10), 2: Figures(25, 10), 3: Figures(22, 10)}] * 3
>>> d = decide("C", 4, hot, AutoscalePolicy(), now_s=100.0, last_change_s=None)
>>> d.action, d.to_intervals, d.reason
('split', 8, 'interval 0 took 400 ms, 17.0x the median 24 ms, in each of the last 3 batches')
>>> cold = [{i: Figures(3, 5) for i in range(8)}] * 3
>>> decide("C", 8, cold, AutoscalePolicy(), now_s=100.0, last_change_s=None).to_intervals
4
>>> decide("C", 8, cold, AutoscalePolicy(), now_s=100.0, last_change_s=90.0) is None  # cooling down
True
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from millwheel._errors import SettingsError

__all__ = ["AutoscalePolicy", "Decision", "Figures", "decide"]


@dataclass(frozen=True)
class Figures:
    """One key interval's figures in one batch."""

    step_ms: float
    keys: int


@dataclass(frozen=True)
class AutoscalePolicy:
    """The thresholds of :func:`decide` (see the module docstring)."""

    hot_ratio: float = 4.0
    min_hot_ms: float = 200.0
    min_hot_keys: int = 20_000
    cold_ms: float = 20.0
    cold_keys: int = 2_000
    window: int = 3
    cooldown_s: float = 60.0
    min_intervals: int = 2
    max_intervals: int = 256

    def __post_init__(self) -> None:
        if (
            self.hot_ratio <= 1
            or self.window < 1
            or self.min_intervals < 1
            or self.max_intervals < self.min_intervals
        ):
            msg = f"AutoscalePolicy needs hot_ratio > 1, window >= 1 and 1 <= min_intervals <= max_intervals, got {self}"
            raise SettingsError(msg)
        if self.cold_ms >= self.min_hot_ms or self.cold_keys >= self.min_hot_keys:
            msg = f"AutoscalePolicy: the cold thresholds must be under the hot ones (hysteresis), got {self}"
            raise SettingsError(msg)


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` decided, with the figures that drove it."""

    computation: str
    #: ``"split"`` or ``"merge"``
    action: str
    from_intervals: int
    to_intervals: int
    #: the figures in words, for the live status and the log
    reason: str
    #: per batch of the window: the hot interval's and the median's figures, or the hottest's
    figures: dict[str, Any] = field(default_factory=dict)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _hot(
    batch: Mapping[int, Figures], policy: AutoscalePolicy
) -> tuple[str, int, float, float] | None:
    """The hottest interval of one batch if it is hot: ``(what, interval, value, median)``."""
    if len(batch) < 2:
        return None
    for what, floor in (("step_ms", policy.min_hot_ms), ("keys", float(policy.min_hot_keys))):
        values = {i: float(getattr(f, what)) for i, f in batch.items()}
        med = _median(list(values.values()))
        top = max(values, key=lambda i: (values[i], -i))
        if values[top] >= floor and values[top] >= policy.hot_ratio * max(med, 1.0):
            return what, top, values[top], med
    return None


def _cold(batch: Mapping[int, Figures], policy: AutoscalePolicy) -> bool:
    return all(f.step_ms < policy.cold_ms and f.keys < policy.cold_keys for f in batch.values())


def decide(
    computation: str,
    intervals: int,
    history: Sequence[Mapping[int, Figures]],
    policy: AutoscalePolicy,
    *,
    now_s: float,
    last_change_s: float | None,
) -> Decision | None:
    """Split, merge or nothing for ``computation`` with ``intervals`` key intervals, from
    ``history``: its last batches' figures (oldest first; one mapping per batch, interval ->
    :class:`Figures`, of the intervals that ran in it), all of the current layout."""
    if last_change_s is not None and now_s - last_change_s < policy.cooldown_s:
        return None
    if len(history) < policy.window:
        return None
    recent = history[-policy.window :]
    hot = [_hot(b, policy) for b in recent]
    if all(h is not None for h in hot) and intervals * 2 <= policy.max_intervals:
        what, interval, value, med = hot[-1]  # type: ignore[misc]
        unit = "ms" if what == "step_ms" else "keys"
        took = "took" if what == "step_ms" else "held"
        reason = f"interval {interval} {took} {value:.0f} {unit}, {value / max(med, 1.0):.1f}x the median {med:.0f} {unit}, in each of the last {policy.window} batches"
        figures = {
            "hot": [
                {"what": h[0], "interval": h[1], "value": h[2], "median": h[3]}
                for h in hot
                if h is not None
            ]
        }
        return Decision(computation, "split", intervals, intervals * 2, reason, figures)
    if (
        all(_cold(b, policy) for b in recent)
        and all(recent)
        and intervals // 2 >= policy.min_intervals
    ):
        top_ms = max(f.step_ms for b in recent for f in b.values())
        top_keys = max(f.keys for b in recent for f in b.values())
        reason = (
            f"every interval took under {policy.cold_ms:.0f} ms (at most {top_ms:.0f}) and held under {policy.cold_keys} keys "
            f"(at most {top_keys}) in each of the last {policy.window} batches"
        )
        return Decision(
            computation,
            "merge",
            intervals,
            intervals // 2,
            reason,
            {"max_step_ms": top_ms, "max_keys": top_keys},
        )
    return None
