"""Reading a run directory: the public API of tools that check or repair a run.

A run directory (``millwheel run ... --checkpoint RUN``, ``SparkRuntime(topology, RUN)``)
holds the stream logs, each query's Spark checkpoint, the outbox and the audit trail
(``docs/runtime.md``). Checkers (``faults/check.py``, Photon's verification) read it
through these names, never through the runtime's private modules, so the runtime can
change how it works inside without breaking them:

* :class:`Location` — a directory on a local or Hadoop file system (``Location.of(uri)``);
* :class:`FileStreamLog` — the stream logs: which files a stream has, their records;
  :func:`min_ts_of` — the oldest timestamp in a stream-log file's name;
  :func:`read_log` — one stream-log file's record columns (with ``fields``, values stored
  as columns: ``docs/runtime.md``), as an Arrow table; :func:`table_records` — its records;
* :class:`ConsumedFiles` — which stream-log files a query's committed batches consumed,
  from its checkpoint; :func:`committed_batches` — a query's committed batches;
* the audit trail: :func:`read_lines` of ``audit/`` + :data:`WATERMARKS` (every published
  low watermark a driver read) and ``audit/`` + :data:`BATCHES` (one line per batch).
"""

from millwheel.runtime._audit import BATCHES, WATERMARKS, read_lines
from millwheel.runtime._consumed import ConsumedFiles
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import committed_batches
from millwheel.runtime._streams import FileStreamLog, min_ts_of, read_log, table_records

__all__ = [
    "BATCHES",
    "WATERMARKS",
    "ConsumedFiles",
    "FileStreamLog",
    "Location",
    "committed_batches",
    "min_ts_of",
    "read_lines",
    "read_log",
    "table_records",
]
