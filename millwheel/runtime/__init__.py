"""The Spark Structured Streaming runtime: the only part of millwheel that imports pyspark.

Names are loaded lazily, so importing ``millwheel.runtime`` imports no pyspark until a
name that needs it is used.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXECUTOR_CLASS",
    "FencedError",
    "FileStreamLog",
    "RuntimeSettings",
    "SparkRuntime",
    "StateLayout",
    "child_processes",
    "committed_unpublished",
    "default_intervals",
    "disk_full",
    "rescale",
    "run_identity",
    "spark_session",
]

_WHERE = {
    "EXECUTOR_CLASS": "millwheel.runtime._cluster",
    "FencedError": "millwheel.runtime._lease",
    "child_processes": "millwheel.runtime._cluster",
    "disk_full": "millwheel.runtime._spark_internals",
    "FileStreamLog": "millwheel.runtime._streams",
    "RuntimeSettings": "millwheel.runtime._settings",
    "SparkRuntime": "millwheel.runtime._runtime",
    "StateLayout": "millwheel.runtime._settings",
    "committed_unpublished": "millwheel.runtime._outbox",
    "default_intervals": "millwheel.runtime._settings",
    "rescale": "millwheel.runtime._online",
    "run_identity": "millwheel.runtime._runpin",
    "spark_session": "millwheel.runtime._session",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module 'millwheel.runtime' has no attribute {name!r}"
    raise AttributeError(msg)
