"""The life a key's first production starts in a Spark micro-batch (``millwheel/_identity.py``).

A batch is named by its query's id — which Spark keeps in the query's checkpoint, so it is
the same across restarts, and a new checkpoint (a run directory started again, a new
epoch) has another — and its micro-batch id, which a replay of the batch (a crash before
its commit) keeps and no other batch of the query has: Spark plans batches in order, a
rescale (``_rescale.py``, ``_move.py``) and a change of state layout (``_relayout.py``)
keep the checkpoint, its offset and commit logs, and so the numbering. Every plan reads it
in the task that runs the step: the interval rows and the per-key rows (``_interval.py``,
``plans/keys.py``), the columnar default mapping on rows or reading the batch's files
(``_columnar.py``, ``_scan.py``) and the Arrow mapping (``plans/arrow.py``, whose tasks run
inside ``foreachBatch`` and are told the batch).
"""

from __future__ import annotations

from millwheel._identity import batch_life
from millwheel.runtime._spark_internals import task_batch_id, task_query_id


def task_life(batch_id: int | None = None) -> int | None:
    """The life of the running task's micro-batch (``batch_id``: the batch, when the caller
    knows it); ``None`` outside a streaming query's task (a step run by a test or a bench)."""
    query = task_query_id()
    batch = task_batch_id() if batch_id is None else batch_id
    return None if query is None or batch is None else batch_life(query, batch)
