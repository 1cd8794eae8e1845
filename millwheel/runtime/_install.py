"""The worker side of a layout change (``_relayout.py``): envelopes installed into a state layout's own stores.

``millwheel rescale --layout`` builds a computation's state in its new layout with a
one-batch query of the new layout's stateful operator, on a scratch checkpoint: its input
is one row per key (``group, key, envelope``: the Spark group of the key's interval in the
new layout), and each group's function here puts its keys into that layout's stores —
the interval row (``GroupState``: :class:`IntervalInstaller`) or the per-key rows
(``transformWithStateInPandas``: :func:`make_installer`) — with each key's
:class:`~millwheel.runtime._interval.KeyMeta` read from its envelope and the interval's
event-time timer at its earliest low-watermark timer, exactly as a batch of the
computation stores them (the same functions). Nothing runs: no record, no timer fires,
no user code is loaded. Each group answers how many keys it installed, so the command
checks that every key landed once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
import pandas as pd

from millwheel.runtime._interval import KeyMeta, earliest
from millwheel.runtime._move import RescaleMismatch, install_envelopes
from millwheel.runtime._spark_internals import MapStatePipeline
from millwheel.runtime.plans.intervals import store_interval
from millwheel.runtime.plans.keys import schedule, state_variables

__all__ = ["INSTALL_INPUT", "INSTALL_OUTPUT", "IntervalInstaller", "make_installer"]

#: the rows of an install query: a key's envelope for the Spark group of its interval
INSTALL_INPUT = "group int, key binary, value binary"
#: what each group answers: how many keys it installed
INSTALL_OUTPUT = "group int, keys long"


def _installs(frames: Iterable[pd.DataFrame]) -> list[tuple[bytes, bytes]]:
    """The ``(key, envelope)`` pairs of a group's frames (a row without a key only makes the batch run)."""
    out: list[tuple[bytes, bytes]] = []
    for pdf in frames:
        out += [
            (k, v)
            for k, v in zip(pdf["key"].tolist(), pdf["value"].tolist(), strict=True)
            if k is not None
        ]
    return out


class _Groups:
    def __init__(self, name: str, groups: Sequence[int]) -> None:
        self.name = name
        self.groups = [int(g) for g in groups]
        self._interval = {g: i for i, g in enumerate(self.groups)}

    def interval(self, group: int) -> int:
        i = self._interval.get(group)
        if i is None:
            msg = f"computation {self.name!r}: an install row names Spark group {group}, not one of the new layout's {self.groups}"
            raise RescaleMismatch(msg)
        return i

    def fill(
        self, group: int, installs: list[tuple[bytes, bytes]]
    ) -> tuple[dict[bytes, Any], dict[bytes, Any]]:
        envs: dict[bytes, Any] = {}
        meta: dict[bytes, Any] = {}
        install_envelopes(
            self.name, self.interval(group), len(self.groups), installs, envs, meta, KeyMeta.make
        )
        return envs, meta


class IntervalInstaller(_Groups):
    """The ``applyInPandasWithState`` function of an install query into the interval-row layout (picklable)."""

    def __call__(
        self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        g = int(group[0])
        if state.exists:
            msg = f"computation {self.name!r}: an install query found state in group {g}: its scratch checkpoint is not new"
            raise RescaleMismatch(msg)
        envs, meta = self.fill(g, _installs(frames))
        # without Spark's timeout: its install query runs without (``_relayout.build_store``)
        store_interval(state, envs, meta, timeouts=False)
        yield pd.DataFrame({"group": [g], "keys": [len(envs)]})


def make_installer(name: str, groups: Sequence[int]) -> Any:
    """The ``StatefulProcessor`` of an install query into the per-key layout (``plans/keys.py``)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class KeyInstaller(StatefulProcessor, _Groups):  # type: ignore[misc]
        def __init__(self) -> None:
            _Groups.__init__(self, name, groups)

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.envs, self.meta, self.timer = state_variables(handle)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            g = int(key[0])
            if self.meta.exists():
                msg = f"computation {self.name!r}: an install query found state in group {g}: its scratch checkpoint is not new"
                raise RescaleMismatch(msg)
            envs, meta = self.fill(g, _installs(rows))
            if envs:
                MapStatePipeline(self.envs).write_many(list(envs.items()), [])
            if envs or meta:
                self.meta.update((msgpack.packb([len(envs), meta], use_bin_type=True),))
            _, nlw_min, _ = earliest(meta.values())
            schedule(
                self.handle,
                self.timer,
                nlw_min,
                timerValues.getCurrentWatermarkInMs(),
                expired=False,
            )
            yield pd.DataFrame({"group": [g], "keys": [len(envs)]})

        def close(self) -> None:
            pass

    return KeyInstaller()
