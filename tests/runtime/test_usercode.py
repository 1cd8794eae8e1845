"""Which user modules are shipped by value; when a failed query is restarted, and when the
run stops (``millwheel/runtime/_usercode.py``)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

import pytest

from millwheel._errors import RunError
from millwheel.runtime._spark_internals import disk_full
from millwheel.runtime._usercode import RestartPolicy, _importable_by_name

#: the shape of a query failure whose sink's Parquet write found the disk full: the Python
#: traceback of the foreachBatch function, then the Java causes (abridged from a real one)
FULL = """[STREAM_FAILED] Query [id = 1] terminated with exception: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/millwheel/runtime/_outbox.py", line 167, in sink
    df.write.mode("overwrite").partitionBy("stream").parquet(target.uri)
py4j.protocol.Py4JJavaError: An error occurred while calling o5096.parquet.
: org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to file:/run/outbox/C/7/e1.
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError(QueryExecutionErrors.scala:774)
Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
Caused by: java.io.IOException: No space left on device
"""


class Failure(Exception):
    pass


class EditableFinder:
    """What ``pip install -e`` puts on ``sys.meta_path``: a finder for one package whose
    source is on no ``sys.path`` entry."""

    def __init__(self, name: str, origin: str) -> None:
        self.name, self.origin = name, origin

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        return importlib.util.spec_from_file_location(name, self.origin)


def test_a_module_any_import_finder_finds_goes_by_name_and_a_topology_file_by_value(
    tmp_path, monkeypatch
):
    (tmp_path / "devpkg.py").write_text("")
    finder = EditableFinder("devpkg", str(tmp_path / "devpkg.py"))
    assert not _importable_by_name("devpkg.counting")  # found by nothing: shipped by value
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    assert _importable_by_name("devpkg.counting")  # a worker's interpreter finds it too
    assert _importable_by_name("json") and _importable_by_name("sys")
    assert not _importable_by_name("__main__")
    assert not _importable_by_name("_millwheel_topology_counts")  # imported by path
    assert importlib.machinery.PathFinder.find_spec("devpkg", sys.path) is None


def test_a_full_disk_stops_the_run_at_once_with_what_to_do():
    policy = RestartPolicy("computation 'C'", max_restarts=20)
    with pytest.raises(
        RunError,
        match=r"computation 'C' failed: no space left on device \(org\.apache\.hadoop\.fs\.FSError: java\.io\.IOException: No space left on device\)\. Free space .* same run directory to resume",
    ):
        policy.failed(Failure(FULL))
    assert (
        disk_full(Failure("OSError: [Errno 28] No space left on device: '/run/tallies/C.json'"))
        is not None
    )


def test_other_failures_are_retried_and_a_repeated_code_error_stops():
    policy = RestartPolicy("computation 'C'", max_restarts=20)
    assert disk_full(Failure("Python worker exited unexpectedly (crashed)")) is None
    assert "restarting from its checkpoint" in policy.failed(
        Failure("Python worker exited unexpectedly (crashed)")
    )
    bug = Failure(
        "Traceback (most recent call last):\n  File \"t.py\", line 1, in f\nKeyError: 'x'\n"
    )
    assert "restarting" in policy.failed(bug)
    with pytest.raises(RunError, match="failed twice with the same error"):
        policy.failed(bug)
