"""Runs of one arrival watermark in a columnar batch: the columnar form of ``_delivery.plan_steps``.

A batch may hold records that arrived under several watermarks (files of several upstream
batches read in one micro-batch). The per-key step cuts a key's records into runs of one
arrival watermark, in that order, and after each run fires the key's due timers: event-time
ones up to the key's next run's watermark (its records are not late, so their windows must
still be open), up to the batch's low watermark after the last run (§4.5, §4.6). Each of
these calls has its own fire budget, and a key that keeps nothing after one starts a new
life in the next (``_identity.call_life``).

The columnar runner keeps that order for every key at once (:class:`Runs`): the batch's
records one arrival watermark after the other (a call of user code per watermark with
records), then, for the keys of that watermark that have a later run, the timers due by
their next run's watermark (:func:`due_rounds`: a call per distinct bound, only where some
are due). The keys of a call are independent, so the results per key are the per-key
step's. A batch under one arrival watermark, the common case, is one run: none of this runs.

>>> runs = Runs(np.array([900, 1_100, 900]), np.array([0, 0, 1]), 2_000)
>>> runs.count, runs.rows(0).tolist(), runs.rows(1).tolist(), runs.call_watermark(0)
(2, [0, 2], [1], 1100)
>>> [(k.tolist(), b.tolist(), n.tolist()) for k, b, n in map(runs.keys, range(2))]
[([0, 1], [1100, 2000], [True, False]), ([0], [2000], [False])]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from millwheel._coltimers import TimerTable
from millwheel._contract import timers_due


class Runs:
    """A batch's rows cut by arrival watermark (``late_wm``: each row's, as the late rule
    judges it; ``kcodes``: each row's key); see the module docstring."""

    __slots__ = ("order", "wms", "_bounds", "_ends", "_lw", "_pk", "_pnext", "_pstart", "_starts")

    def __init__(self, late_wm: np.ndarray, kcodes: np.ndarray, low_watermark: int) -> None:
        self._lw = low_watermark
        #: the rows by arrival watermark, each watermark's in delivery order (a stable sort:
        #: arrival watermarks only grow, so this is the order they were sent in)
        self.order = np.argsort(late_wm, kind="stable")
        self.wms, starts = np.unique(late_wm[self.order], return_index=True)
        s = len(self.wms)
        self._starts, self._ends = starts, np.r_[starts[1:], len(late_wm)]
        # each (key, run) pair once, per key by watermark: a key's next run is the next pair
        pair = np.unique(kcodes.astype(np.int64) * s + np.searchsorted(self.wms, late_wm))
        pk, ps = pair // s, pair % s
        has_next = np.r_[pk[1:] == pk[:-1], False]
        bounds = np.full(len(pair), low_watermark, np.int64)
        nxt = np.flatnonzero(has_next)
        bounds[nxt] = np.minimum(self.wms[ps[nxt + 1]], low_watermark)
        by_run = np.argsort(ps, kind="stable")
        self._pk, self._bounds, self._pnext = pk[by_run], bounds[by_run], has_next[by_run]
        self._pstart = np.searchsorted(ps[by_run], np.arange(s + 1))

    @property
    def count(self) -> int:
        return len(self.wms)

    def rows(self, s: int) -> np.ndarray:
        """The rows of run ``s`` (all, admitted or not), in delivery order."""
        return self.order[self._starts[s] : self._ends[s]]

    def call_watermark(self, s: int) -> int:
        """The low watermark of run ``s``'s call (``Batch.low_watermark``): the next run's
        arrival watermark, the batch's after the last."""
        return self._lw if s + 1 >= self.count else min(self._lw, int(self.wms[s + 1]))

    def keys(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The keys with rows in run ``s``, ascending; for each the watermark its timers fire up
        to after the run (its next run's, else the batch's low watermark), and whether it has
        a later run (else its timers fire with every key's at the end of the batch)."""
        a, b = self._pstart[s], self._pstart[s + 1]
        return self._pk[a:b], self._bounds[a:b], self._pnext[a:b]


def due_rounds(
    timers: TimerTable, kbs: np.ndarray, bounds: np.ndarray, now: int
) -> list[tuple[int, set[bytes]]]:
    """Which of keys ``kbs`` (an object array of distinct encoded keys) have a timer due, an
    event-time one by the key's bound, a wall-time one by ``now``: the keys grouped by bound,
    ascending (one firing round each; none where nothing is due)."""
    if not len(timers) or not len(kbs):
        return []
    pos = pd.Index(kbs).get_indexer(timers.kb)
    rows = np.flatnonzero(pos >= 0)
    if not len(rows):
        return []
    own = pos[rows]
    due = timers_due(timers.ts[rows], timers.d[rows], bounds[own], now)
    if not due.any():
        return []
    k = np.unique(own[due])
    kb, b = kbs[k], bounds[k]
    return [(int(lw), set(kb[b == lw].tolist())) for lw in np.unique(b)]
