"""Percentile low watermarks (MillWheel §7.2): the progress of ``pct`` percent of the pending work.

:func:`weighted_percentile` is the definition; :meth:`Authority.percentile_watermark
<watermark_authority.Authority.percentile_watermark>` applies it to a computation's key
intervals (weighted by their pending work) or an injector's processes, and publishes the
result so that it never goes back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from watermark_authority._time import MIN_TIMESTAMP

#: a reported ``pending`` count is an int64 >= 0; as a percentile weight it saturates here,
#: so that the sum over every key interval stays exact in 64 bits (up to 8M intervals)
MAX_WEIGHT = 2**40


def pct_key(pct: float) -> str:
    """How a percentile is named in the journal and the status: ``99.0`` -> ``'99.000'``."""
    return f"{pct:.3f}"


def weighted_percentile(values: Sequence[int], weights: Sequence[int], pct: float) -> int:
    """The ``pct`` percentile watermark of intervals with oldest work ``values`` (§7.2).

    Strip the oldest ``100 - pct`` percent of the pending work, then take the minimum of
    what is left. Precisely: sort the intervals by value; let ``C(k)`` be the total weight of
    the intervals before the ``k``-th; the result is the value of the last interval ``k``
    with ``C(k) <= (100 - pct)% of the total weight``. With ``pct = 100`` this is the
    minimum. An interval of weight 0 (no pending work) never holds the result back. A
    weight above ``MAX_WEIGHT`` (2**40) counts as ``MAX_WEIGHT``.

    >>> weighted_percentile(list(range(1, 101)), [1] * 100, 99)     # drop the oldest 1%
    2
    >>> weighted_percentile(list(range(1, 101)), [1] * 100, 50)
    51
    >>> weighted_percentile([10, 20], [1, 99], 99)                  # 1% of the work is at 10
    20
    >>> weighted_percentile([10, 20], [2, 98], 99)
    10
    >>> weighted_percentile([10, 20], [2**63 - 1, 2**63 - 1], 50)   # huge counts stay exact
    20
    """
    if len(values) == 0:
        return MIN_TIMESTAMP
    v = np.asarray(values, dtype=np.int64)
    w = np.minimum(np.asarray(weights, dtype=np.int64), MAX_WEIGHT)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    before = np.concatenate(([0], np.cumsum(w)[:-1]))  # C(k)
    p_milli = round(pct * 1000)
    # C(k) <= total * (100 - pct) / 100, in exact integers (pct to 0.001); C(k) is an integer,
    # so this is C(k) <= floor(total * (100_000 - p_milli) / 100_000), computed in Python ints
    limit = int(w.sum()) * (100_000 - p_milli) // 100_000
    k = int(np.flatnonzero(before <= limit)[-1])
    return int(v[k])
