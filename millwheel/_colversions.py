"""Columnar state versions: a store's state rows upgraded to the computation's ``state_version``.

A :class:`~millwheel.ColumnarComputation` declares ``state_version`` and, for each older
version ``N`` it reads, ``upgrade_from_N(self, state) -> state`` over a frame of state rows
(a ``key`` column and the stored columns, as ``Batch.state``). The version is kept per
:class:`~millwheel._colstore.ColumnarStore` (one per key interval on Spark, one per
computation in the harness), since a store is one blob written whole: when the runner reads
a store of an older version, :func:`upgrade_store` upgrades all its rows at once, in one
call per version step, and the batch stores them at the new version (the store is rewritten
by every batch that touches it). A store without state rows takes the code's version as it
is.

A store the code cannot upgrade (a newer version, a missing upgrade, an upgrade that raised
or returned rows of keys the store did not hold) is left as it is: every call of user code
over its keys fails with the :class:`~millwheel.StateVersionError`, which the computation's
``ErrorPolicy`` raises or dead-letters record by record (and timer by timer), as on the
per-record path (``_versions.py``); the store keeps its state rows and version.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from millwheel._colbatch import _columns, to_arrow
from millwheel._colstore import ColumnarStore
from millwheel._errors import StateCodecError, StateVersionError
from millwheel._record import Key, decode_key
from millwheel._versions import UPGRADE_PREFIX, upgrade


def upgrade_store(runner: Any, st: ColumnarStore) -> StateVersionError | None:
    """Upgrade ``st``'s state rows to ``runner``'s computation's version, in place; the
    error (``st`` unchanged) if it cannot be."""
    comp = runner.computation
    current = type(comp).state_version
    stored = st.state_version
    if stored == current:
        return None
    if stored is None or st.state is None or st.state.num_rows == 0:
        st.state_version = current  # nothing stored to upgrade
        return None
    table = st.state
    kbs = table.column("_kb").to_pylist()
    key_of: dict[bytes, Key] = {kb: decode_key(kb) for kb in dict.fromkeys(kbs)}
    kb_of = {k: kb for kb, k in key_of.items()}
    frame = pd.DataFrame(
        {"key": [key_of[kb] for kb in kbs], **_columns(table.drop_columns(["_kb"]))}
    )

    def step(n: int) -> Any:
        return getattr(comp, f"{UPGRADE_PREFIX}{n}", None)

    def check(n: int, rows: Any) -> None:
        if not isinstance(rows, pd.DataFrame) or "key" not in rows.columns:
            msg = f"{UPGRADE_PREFIX}{n} must return a DataFrame with a 'key' column, got {type(rows).__name__}"
            raise StateCodecError(msg)
        strange = [k for k in rows["key"].tolist() if k not in kb_of]
        if strange:
            msg = f"{UPGRADE_PREFIX}{n} returned rows of key {strange[0]!r}, which the store did not hold"
            raise StateCodecError(msg)

    try:
        rows = upgrade(frame, stored, current, step, type(comp).__qualname__, check)
        new = None
        if len(rows):
            new = to_arrow(rows).add_column(
                0, "_kb", pa.array([kb_of[k] for k in rows["key"].tolist()], pa.binary())
            )
    except StateVersionError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - rows that Arrow cannot store: the upgrade's failure
        why = f"the upgraded rows cannot be stored as Arrow columns: {type(exc).__name__}: {str(exc)[:200]}"
        err = StateVersionError(type(comp).__qualname__, stored, current, why)
        err.__cause__ = exc
        return err
    st.state, st.state_version = new, current
    return None
