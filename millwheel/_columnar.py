"""Columnar computations: a micro-batch of many keys as columns, inside the exactly-once envelope.

The per-record contract (``process_record`` once per record, ``process_timer`` once per
timer, ``_step.py``) costs Python work per record and per key. A
:class:`ColumnarComputation` gets a batch of records of *many keys at once* as a pandas
frame and answers with columns: per-key state read and replaced in bulk, timers set and
deleted as columns, productions as columns. Everything MillWheel guarantees per key is
kept, by the framework, around each call (``ColumnarRunner``, ``_colrunner.py``, under the
delivery contract the per-record step runs under too, ``_contract.py``):

* **exactly once** (§6.1.1): ``(key, id)`` pairs are checked for the whole batch in a few
  numpy calls (``_coldedup.py``: fingerprints, a Bloom filter over a bit array, the exact
  ids only for a "maybe"); duplicates never reach user code;
* **late records** (§4.5): judged per record against the watermark it arrived under;
  the computation's :class:`~millwheel.LatePolicy` applies;
* **order** (§4.1, §4.6): within a key, records in delivery order (the frame is grouped
  by key, keys in order of first appearance); then due timers, per key in timestamp order
  (ties by domain, then tag); a timer set while firing that is already due fires in the
  next round of the same batch;
* **holds** (§7.2): per key, low-watermark timers, ``hold_watermark`` and (harness)
  pending strong productions;
* **atomicity** (§6.2): each call is applied all or nothing. A call that raises is run
  again per key; a key whose call raises falls back to one record (one timer) per call,
  and each record or timer that still raises is rolled back and dead-lettered with its
  reason, as on the per-record path;
* **production ids** (§6.1.2): ``production_id(computation, key, seq, life)`` with the
  per-key sequence and the key's life kept in the store (``_identity.py``): a replay of
  the batch assigns the same ids, a key forgotten and made again in a later batch never
  repeats one, and a columnar computation that produces what a per-record one does, in
  the same per-key order and batches, produces the same records.

What the framework keeps per key interval (the harness: per computation) is one blob, the
*columnar store* (:class:`ColumnarStore`): the user's state as an Arrow table with a key
column, the timers, each key's production sequence, life and hold, pending strong productions,
and the dedup index — one atomic write per interval and micro-batch.

>>> import pandas as pd
>>> from millwheel.testing import Harness
>>> class Count(ColumnarComputation):
...     record_columns = ("key", "timestamp")            # values are not decoded
...     def process_batch(self, batch):
...         n = batch.records.groupby("key", sort=False, observed=True).size().rename("n").reset_index()
...         old = batch.state
...         if len(old):
...             n = pd.concat([n, old]).groupby("key", sort=False, as_index=False, observed=True)["n"].sum()
...         batch.set_state(n)
...         batch.set_timers(n["key"], ["end"] * len(n), [1_000] * len(n))
...     def process_timers(self, batch, timers):
...         s = batch.state
...         batch.produce("counts", list(zip(s["key"], s["n"])), keys=s["key"], timestamps=[1_000] * len(s))
...         batch.set_state(s.iloc[:0])
>>> h = Harness.for_computation(Count, inputs={"q": lambda r: r.value}, outputs=["counts"])
>>> h.inject("q", [h.record("cats", 10, id="a"), h.record("dogs", 20, id="b"), h.record("cats", 30, id="a")])
>>> h.finish("q"); h.run()
RunResult(counts=2, q=3)
>>> sorted(h.values("counts")), h.metrics("Count")["duplicates"]
([('cats', 1), ('dogs', 1)], 1)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from millwheel._computation import Computation
from millwheel._errors import ComputationError, DeclarationError
from millwheel._fields import FIELD_PREFIX
from millwheel._record import Record
from millwheel._versions import check_upgrades, check_version

if TYPE_CHECKING:
    import pandas as pd

    from millwheel._colbatch import Batch

RECORD_COLUMNS = ("key", "id", "timestamp", "stream", "value")
TIMER_COLUMNS = ("key", "tag", "timestamp", "domain")


class ColumnarComputation(Computation):
    """Base class of columnar computations: override :meth:`process_batch` (and
    :meth:`process_timers` if you set timers). See the module docstring.

    ``record_columns`` lists the columns :attr:`Batch.records` carries (``key`` always, as
    the records are grouped by it); leave ``"value"`` out and values are never decoded (a
    count needs only keys and timestamps). A name that is not a column is an error as the
    class is defined (or, for a ``property``, as it is first run).
    ``"value.<field>"`` asks for one field of the values (``millwheel/_fields.py``): on a
    stream that declares its fields, read from the file's columns without unpickling; a
    value stored pickled gives its field, a missing field or a value that is not a
    mapping gives null.

    ``state_version`` is the version of the state the class stores (default 1), and a method
    ``upgrade_from_N(self, state)`` for an older version ``N`` turns the state rows version
    ``N`` stored (a frame with a ``key`` column, as :attr:`Batch.state`) into rows of version
    ``N + 1``. A store of an older version is upgraded through them when the runner first
    reads it, and stored at the new version by that batch (``millwheel/_colversions.py``).
    """

    record_columns: ClassVar[tuple[str, ...]] = RECORD_COLUMNS
    #: the version of the state rows this class stores (``upgrade_from_N`` upgrades older ones)
    state_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        what = f"columnar computation {cls.__qualname__}"
        check_version(cls.state_version, f"{what}: state_version")
        check_upgrades(cls, cls.state_version, what)
        if not isinstance(cls.record_columns, property):  # a property: checked by the runner
            check_record_columns(cls.record_columns, what)

    def process_batch(self, batch: Batch) -> None:
        """Called with records of many keys (:attr:`Batch.records`), once per batch (or per key, record: see the module docstring)."""
        msg = f"columnar computation {self.name or type(self).__name__!r} must override process_batch(self, batch)"
        raise NotImplementedError(msg)

    def process_timers(self, batch: Batch, timers: pd.DataFrame) -> None:
        """Called with due timers (``key, tag, timestamp, domain``), per key in timestamp order."""
        msg = f"columnar computation {self.name or type(self).__name__!r} set timers but does not override process_timers(self, batch, timers)"
        raise ComputationError(msg)

    def process_record(self, record: Record) -> None:
        """Not used: the framework calls :meth:`process_batch` (with one record when it falls back)."""
        msg = f"columnar computation {self.name or type(self).__name__!r} runs process_batch, not process_record"
        raise ComputationError(msg)


def check_record_columns(cols: Any, what: str) -> None:
    """``cols`` names columns of a batch's records (:data:`RECORD_COLUMNS`, ``value.<field>``),
    else a :class:`DeclarationError` that names the columns there are."""
    if isinstance(cols, str) or not isinstance(cols, (tuple, list)):
        msg = f"{what}: record_columns is a tuple of column names, got {cols!r}"
        raise DeclarationError(msg)
    bad = [
        c
        for c in cols
        if c not in RECORD_COLUMNS
        and not (isinstance(c, str) and c.startswith(FIELD_PREFIX) and len(c) > len(FIELD_PREFIX))
    ]
    if bad:
        msg = (
            f"{what}: record_columns names {bad}, not columns of a batch's records: "
            f"{', '.join(RECORD_COLUMNS)}, or {FIELD_PREFIX}<field> for one field of the values"
        )
        raise DeclarationError(msg)


def is_columnar(cls: type) -> bool:
    """Whether a computation class runs on the columnar path."""
    return isinstance(cls, type) and issubclass(cls, ColumnarComputation)


#: what the runner's modules define, imported when first asked for: a columnar computation is
#: declared without pandas or pyarrow (``import millwheel`` loads neither), run with them
_RUNNER = {
    "Batch": "millwheel._colbatch",
    "ColumnarResult": "millwheel._colrunner",
    "ColumnarRunner": "millwheel._colrunner",
    "METRIC_NAMES": "millwheel._colrunner",
    "ColumnarStore": "millwheel._colstore",
    "STORE_MAGIC": "millwheel._colstore",
    "STORE_VERSION": "millwheel._colstore",
    "InputColumns": "millwheel._colinput",
}


def __getattr__(name: str) -> Any:
    module = _RUNNER.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["RECORD_COLUMNS", "TIMER_COLUMNS", "ColumnarComputation", "is_columnar"]
