"""What the Spark runtime costs around the per-key step (a benchmark aid, not a feature).

``runtime_bench.py --variants ...,mw_noop,mw_floor`` runs two computations over the
windowed count's input next to the real one, to say how much of a run is the user's code
and the per-key step, and how much is everything around them:

* :class:`Noop` — a computation whose ``process_record`` does nothing (weak productions,
  no dedup): the per-key step with the cheapest possible user code. Each record is still
  decoded, built into a ``Record`` and passed to the computation.
* :class:`Floor` — the per-key step itself skipped: the worker's
  :meth:`~millwheel.runtime._interval.IntervalBatch.run` is replaced, for this computation
  only, by one that counts each key's rows and stores one small envelope per key. What is
  left is the runtime's floor: Spark's scan, the keying stage, the shuffle, the Arrow and
  pandas round trip through the Python worker, grouping rows by key, the interval's state
  row, the summary rows and the outbox. No value is decoded and no ``Record`` is built.

The replacement is installed when this module is imported, which happens in each Python
worker when it unpickles :class:`Floor` (the module is importable there: the bench puts
``bench/`` on ``PYTHONPATH`` before Spark starts); other computations in the same worker
keep the real step.
"""

from __future__ import annotations

from millwheel import Computation, Record
from millwheel._delivery import KeyOutcome
from millwheel.runtime._interval import IntervalBatch

_real_run = IntervalBatch.run


def _floor_run(self: IntervalBatch, envelopes):  # noqa: ANN001, ANN202 - IntervalBatch.run's signature
    if self.owner.spec.cls is not Floor:
        return _real_run(self, envelopes)
    totals = self.totals
    outcomes = {}
    for kb, rows in self.per_key.items():
        totals.records_in += len(rows)
        totals.processed += len(rows)
        outcomes[kb] = KeyOutcome(b"\x01")  # a key's envelope: kept, never read
    return outcomes


IntervalBatch.run = _floor_run  # type: ignore[method-assign]


class Noop(Computation):
    """Does nothing with its records."""

    def process_record(self, record: Record) -> None:
        pass


class Floor(Computation):
    """Never runs: its keys' step is skipped (module docstring)."""

    def process_record(self, record: Record) -> None:  # pragma: no cover - replaced in the worker
        msg = "the floor variant's step should have been skipped"
        raise AssertionError(msg)
