"""``ModelCalculator``: a long-lived per-query model of expected traffic (MillWheel §2, Fig. 1–2).

Zeitgeist "builds a historical model of each query, so that expected changes in traffic
(e.g. for "television listings" in the early evening) will not cause false positives"
(§2), and the model "can correspond to months of continuous updates" (§2, *Persistent
Storage*): it is per-key persistent state (§4.4) that is never cleared.

The model here is a seasonal moving average with an EWMA level:

* the "day" (``day_ms``, short by default because samples last minutes) is cut into
  ``slot_ms`` slots; ``profile[s]`` is an EWMA of the counts of the windows in slot ``s`` (a running
  mean while it has fewer than ``1/gamma`` of them);
* once every slot has been seen for a whole day, ``shape[s] = profile[s] / mean(profile)``
  is the seasonal shape (and the level restarts from ``mean(profile)``); before that the
  shape is flat (1.0) and, with ``require_season`` (the default), no prediction is
  published: a query has no history to compare with before its first day;
* ``level`` is an EWMA of de-seasonalised counts (``count / shape[s]``);
* the prediction for a bucket in slot ``s`` is ``level * shape[s]``.

The shape is smoothed over neighbouring slots. Outliers (windows outside both
``[1/outlier_ratio, outlier_ratio] x prediction`` and ``prediction ± 3 sqrt(prediction)``,
Poisson noise) update the model with a much smaller weight (``outlier_weight``) and clipped to the band, so a spike
or a dip does not become the norm, yet a lasting change is learnt eventually. The band applies once the model has
seen a whole day: before, its level-only prediction is no yardstick (a stream's first, partial window would set it).

For each window from ``WindowCounter`` the calculator produces one record to its output
(default ``window_models``): the window, the ``expected`` count the model predicted for it
*before* learning from it, and a compact ``model`` snapshot the ``SpikeDetector`` keeps to
predict the buckets that are still filling (:func:`expected_count`).

>>> from millwheel.testing import Harness
>>> h = Harness.for_computation(ModelCalculator, inputs={"w": lambda r: r.value["key"]},
...                             outputs=["window_models"], params={"day_ms": 6_000, "slot_ms": 1_000, "warmup_windows": 4})
>>> counts = [10, 20, 30, 30, 20, 10] * 3 + [40]
>>> h.inject("w", [h.record({"key": "cats", "window_start": i * 1000, "count": c}, (i + 1) * 1000)
...                for i, c in enumerate(counts)])
>>> h.finish("w")
>>> out = h.run().values("window_models")
>>> [m["expected"] for m in out[:6]]            # warming up: less than a day of history
[None, None, None, None, None, None]
>>> [round(m["expected"]) for m in out[-7:]]   # learnt the seasonal pattern (smoothed)
[12, 19, 27, 27, 20, 12, 12]
>>> out[-1]["count"], out[-1]["model"]["windows"]
(40, 19)
"""

from __future__ import annotations

import math
from typing import Any

from millwheel import Computation, Record


def new_model(day_ms: int, slot_ms: int, window_ms: int = 1_000) -> dict[str, Any]:
    """An empty model (plain dict: cheap to pickle into state and to ship in productions)."""
    slots = max(1, day_ms // slot_ms)
    return {
        "day_ms": day_ms,
        "slot_ms": slot_ms,
        "window_ms": window_ms,
        "profile": [0.0] * slots,
        "seen": [0] * slots,
        "level": None,
        "windows": 0,
        "last_window": None,
        "seasonal": False,
    }


def slot_of(model: dict[str, Any], bucket_start: int) -> int:
    """The time-of-day slot of a bucket."""
    return (bucket_start % model["day_ms"]) // model["slot_ms"] % len(model["profile"])


def is_seasonal(model: dict[str, Any] | None) -> bool:
    """True once every slot of the day has a whole day of history (the shape is trusted)."""
    return bool(model and model["seasonal"])


def _shape(model: dict[str, Any], slot: int) -> float:
    if not model["seasonal"]:
        return 1.0
    profile = model["profile"]
    n = len(profile)
    mean = sum(profile) / n
    if mean <= 0:
        return 1.0
    # seasonality is smooth: a [1, 2, 1] kernel over neighbouring slots (circular) damps noise
    smoothed = (
        (profile[(slot - 1) % n] + 2 * profile[slot] + profile[(slot + 1) % n]) / 4
        if n >= 3
        else profile[slot]
    )
    return max(smoothed, 0.0) / mean


def expected_count(model: dict[str, Any] | None, bucket_start: int) -> float | None:
    """The model's prediction for the bucket starting at ``bucket_start``, or ``None`` if empty.

    >>> m = new_model(day_ms=2_000, slot_ms=1_000)
    >>> expected_count(m, 0) is None
    True
    >>> for i, c in enumerate([10, 30, 10, 30]):
    ...     _ = update_model(m, i * 1_000, c, alpha=0.5, gamma=0.5, outlier_ratio=10, outlier_weight=0.1)
    >>> round(expected_count(m, 4_000)), round(expected_count(m, 5_000))
    (10, 30)
    """
    if model is None or model["level"] is None:
        return None
    return model["level"] * _shape(model, slot_of(model, bucket_start))


def update_model(
    model: dict[str, Any],
    bucket_start: int,
    count: int,
    *,
    alpha: float,
    gamma: float,
    outlier_ratio: float,
    outlier_weight: float,
    outlier_z: float = 3.0,
) -> float | None:
    """Learn one window; return the prediction made for it *before* learning.

    Missing buckets between the previous window and this one (the window counter stops
    emitting zeros for idle keys) decay the level as zeros would.
    """
    predicted = expected_count(model, bucket_start)
    slot = slot_of(model, bucket_start)
    last = model["last_window"]
    if last is not None and model["level"] is not None:
        gap = (bucket_start - last) // model["window_ms"] - 1
        if gap > 0:
            model["level"] *= (1 - alpha) ** min(gap, 10_000)
    weight = 1.0
    x = float(count)
    if predicted is not None and model["seasonal"] and predicted > 0:
        # outside both a ratio band and a Poisson-noise band (small counts are noisy); only
        # once the model trusts its prediction (a whole day seen): before, a stream's first,
        # partial window (it starts mid-second) set a level so low that every later window
        # was clipped to twice it and learnt as an outlier, and the first day's profile
        # stayed at half the traffic: false spikes at its peaks (test_model_calculator.py)
        noise = outlier_z * math.sqrt(predicted)
        lo = min(predicted / outlier_ratio, predicted - noise)
        hi = max(predicted * outlier_ratio, predicted + noise)
        if not lo <= x <= hi:
            weight = outlier_weight
            x = min(max(x, lo), hi)
    a, g = alpha * weight, gamma * weight
    shape = _shape(model, slot)
    deseasonalised = x / shape if shape > 0 else x
    model["level"] = x if model["level"] is None else (1 - a) * model["level"] + a * deseasonalised
    seen = model["seen"][slot] + 1
    # a running mean until it would weigh less than the EWMA does (the first day), then the EWMA
    g = max(g, 1.0 / seen) if weight == 1.0 else g
    model["profile"][slot] = x if seen == 1 else (1 - g) * model["profile"][slot] + g * x
    model["seen"][slot] = seen
    model["windows"] += 1
    if not model["seasonal"] and min(model["seen"]) >= max(
        1, model["slot_ms"] // model["window_ms"]
    ):
        # a whole day seen: switch to the seasonal model, its level the day's mean
        model["seasonal"] = True
        model["level"] = sum(model["profile"]) / len(model["profile"])
    if last is None or bucket_start > last:
        model["last_window"] = bucket_start
    return predicted


def snapshot(model: dict[str, Any]) -> dict[str, Any]:
    """A copy of the model safe to ship in a production (the state object keeps changing)."""
    out = dict(model)
    out["profile"] = list(model["profile"])
    out["seen"] = list(model["seen"])
    return out


class ModelCalculator(Computation):
    """Per query: learn each window into a seasonal model; produce window + expectation + model.

    Consumes ``{"key", "window_start", "count"}`` (``WindowCounter``'s output); produces
    ``{"key", "window_start", "count", "expected", "model"}`` with the window's end as
    timestamp (no smaller than the window's, §4.5). ``expected`` and ``model`` are
    ``None`` until the model has seen ``warmup_windows`` windows and (``require_season``)
    a whole day.
    """

    def __init__(
        self,
        output: str = "window_models",
        day_ms: int = 60_000,
        slot_ms: int = 3_000,
        alpha: float = 0.1,
        gamma: float = 0.3,
        outlier_ratio: float = 2.0,
        outlier_weight: float = 0.05,
        warmup_windows: int = 10,
        window_ms: int = 1_000,
        require_season: bool = True,
    ) -> None:
        self.output = output
        self.day_ms = day_ms
        self.slot_ms = slot_ms
        self.alpha = alpha
        self.gamma = gamma
        self.outlier_ratio = outlier_ratio
        self.outlier_weight = outlier_weight
        self.warmup_windows = warmup_windows
        self.window_ms = window_ms
        self.require_season = require_season

    def process_record(self, record: Record) -> None:
        model = self.state.get() or self.new()
        value, ts = self.learn(self.key, model, record.value, record.timestamp)
        self.state.set(model)  # long-term state: never cleared (§2)
        self.produce(self.output, value, timestamp=ts)

    def new(self) -> dict[str, Any]:
        """A key's model before its first window."""
        return new_model(self.day_ms, self.slot_ms, self.window_ms)

    def learn(
        self, key: Any, model: dict[str, Any], window: Any, timestamp: int
    ) -> tuple[dict[str, Any], int]:
        """The rule of one window (shared with ``columnar_model.ColumnarModelCalculator``):
        ``model`` learns it in place; returns the production's value and timestamp."""
        start = window["window_start"]
        warm = model["windows"] >= self.warmup_windows and (
            model["seasonal"] or not self.require_season
        )
        predicted = update_model(
            model,
            start,
            window["count"],
            alpha=self.alpha,
            gamma=self.gamma,
            outlier_ratio=self.outlier_ratio,
            outlier_weight=self.outlier_weight,
        )
        value = {
            "key": key,
            "window_start": start,
            "count": window["count"],
            "expected": predicted if warm else None,
            "model": snapshot(model) if warm else None,
        }
        return value, max(timestamp, start + self.window_ms)
