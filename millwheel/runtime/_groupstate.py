"""An interval's ``GroupState`` kept in memory: what runs the interval step without Spark.

``_interval.py`` re-exports it (``from millwheel.runtime._interval import MemoryGroupState``).
"""

from __future__ import annotations

__all__ = ["MemoryGroupState"]


class MemoryGroupState:
    """The part of Spark's ``GroupState`` that :class:`IntervalStep` uses, kept in memory:
    its contract with Spark, and what runs an interval's step without Spark (the tests,
    ``bench/worker_profile.py``). ``watermark`` and ``now`` are what the batch sees; the
    last timeout set is kept in ``timeout``."""

    def __init__(self, watermark: int = 0, now: int = 0) -> None:
        self.value: tuple[bytes, bytes] | None = None
        self.watermark = watermark
        self.now = now
        self.timeout: int | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[bytes, bytes] | None:
        return self.value

    def update(self, value: tuple[bytes, bytes]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 - Spark's name
        return self.watermark

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        return self.now

    def setTimeoutTimestamp(self, t: int) -> None:  # noqa: N802
        self.timeout = t
