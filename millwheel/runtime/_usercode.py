"""User code on Spark's Python workers: shipping it, and reporting its failures.

* **Shipping.** A topology file's own classes and functions (``millwheel run my_topology.py``
  imports the file as ``_millwheel_topology_my_topology``; a test module imported by path
  is the same case) exist in no module a worker can import, so they are pickled *by
  value* with ``cloudpickle.register_pickle_by_value`` (the supported API of the
  cloudpickle that PySpark ships). Modules the topology file
  imports from its own directory (``from my_helpers import Parser``) are importable by
  name once that directory is on the workers' ``PYTHONPATH``: the driver's own import
  path entries that are not part of the Python installation are put there before Spark
  starts its workers.
* **Failures.** A failure in a worker reaches the driver as a Java exception of thousands
  of lines with the Python traceback somewhere inside. :func:`python_error` digs the
  traceback out so the user sees one clear message; :func:`is_transient` tells a lost
  worker (kill -9, out of memory: retry from the checkpoint) from a deterministic error
  (the same exception again: stop, do not retry twenty times).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any

from millwheel._errors import RunError
from millwheel.runtime._spark_internals import disk_full, is_transient, python_error

#: the module name prefix under which ``millwheel run`` imports a topology file
TOPOLOGY_MODULE_PREFIX = "_millwheel_topology_"


def _modules_of(topology: Any) -> set[str]:
    """Modules holding the topology's user code: classes, key extractors, parameters, sources."""
    objs: list[Any] = []
    for spec in topology.computations.values():
        objs += [spec.cls, *spec.inputs.values(), *spec.params.values()]
    for inj in topology.injectors.values():
        if inj.source is not None:
            objs.append(type(inj.source))
            if callable(
                getattr(inj.source, "value", None)
            ):  # a SparkSource's parser runs on the executors
                objs.append(inj.source.value)
    names = set()
    for obj in objs:
        name = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        if name:
            names.add(name)
    return names


def _importable_by_name(name: str) -> bool:
    """Would a fresh interpreter with the driver's ``sys.path`` find module ``name``'s package?

    Asks every finder on ``sys.meta_path``, not only the one for ``sys.path``: a package
    installed in development mode (``pip install -e``) is found by the finder its ``.pth``
    file installs, in the driver and in every worker of the same Python. Shipped by value
    instead, its classes would exist twice in a worker, and pickling one of their
    instances (a state, a timer's payload) would fail with "not the same object".
    """
    if name == "__main__" or name.startswith(TOPOLOGY_MODULE_PREFIX):
        return False
    top = name.split(".", 1)[0]
    if top in sys.builtin_module_names:
        return True
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            if find(top, None) is not None:
                return True
        except (ImportError, ValueError, TypeError):
            continue
    return False


def ship_user_code(topology: Any) -> list[str]:
    """Make the topology's own code reach Spark's Python workers; returns the modules shipped by value.

    A module of the topology's classes, extractors or parameters that a worker could not
    import by name (a topology file run by ``millwheel run``, ``__main__``, a test module
    imported by path) is registered for pickling by value; the driver's own import path
    entries outside the Python installation go on the workers' ``PYTHONPATH``. Call before
    the Spark session starts (the workers inherit the driver's environment).
    """
    from pyspark import cloudpickle

    shipped = []
    for name in sorted(_modules_of(topology)):
        module = sys.modules.get(name)
        if module is not None and name != "__main__" and not _importable_by_name(name):
            cloudpickle.register_pickle_by_value(module)
            shipped.append(name)
    paths = sysconfig.get_paths()
    install = {
        os.path.realpath(p)
        for p in (paths["stdlib"], paths["purelib"], paths["platlib"], sys.base_prefix, sys.prefix)
    }
    extra = []
    for entry in sys.path:
        real = os.path.realpath(entry or os.getcwd())
        if (
            os.path.isdir(real)
            and not any(real == p or real.startswith(p + os.sep) for p in install)
            and real not in extra
        ):
            extra.append(real)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(current + [p for p in extra if p not in current])
    return shipped


class RestartPolicy:
    """When a failed query is restarted from its checkpoint, and when the run stops.

    A transient failure (a lost worker) is retried up to ``max_restarts`` times; an error
    in the code is retried once (in case it was transient after all) and stops the run the
    second time it happens the same way, with the Python traceback as the message.
    """

    def __init__(self, what: str, max_restarts: int) -> None:
        self.what = what
        self.max_restarts = max_restarts
        self.restarts = 0
        self._last: str | None = None

    def failed(self, exc: Any) -> str:
        """Record a failure; return the line to log, or raise :class:`~millwheel.RunError` to stop."""
        full = disk_full(exc)
        if full is not None:
            # restarting cannot help, and each restart would fail the same way: stop now
            msg = (
                f"{self.what} failed: no space left on device ({full}). Free space on the run "
                "directory's disk (or Spark's local directory), then run again with the same run "
                "directory to resume: what was committed is kept, the failed batch is recomputed"
            )
            raise RunError(msg)
        message = python_error(exc)
        self.restarts += 1
        if not is_transient(exc):
            # the same exception (its last line: type and message), whatever Spark's task ids
            signature = message.strip().splitlines()[-1] if message.strip() else message
            if signature == self._last:
                msg = f"{self.what} failed twice with the same error, so it is not retried again:\n{message}"
                raise RunError(msg)
            self._last = signature
        if self.restarts > self.max_restarts:
            msg = f"{self.what} failed {self.restarts} times; last error:\n{message}"
            raise RunError(msg)
        return (
            f"{self.what} failed ({message.splitlines()[-1][:200]}); restarting from its checkpoint"
        )
