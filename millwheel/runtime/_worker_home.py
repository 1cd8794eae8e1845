"""The Spark home a local session runs under: Python workers import compiled PySpark.

Spark starts each of its Python processes with ``$SPARK_HOME/python/lib/pyspark.zip``
first on ``PYTHONPATH`` (``PythonUtils.sparkPythonPath``). These are the workers, a data
source's planners and a streaming source's runner. Python keeps no bytecode for modules
imported from a zip, so each of those processes compiles PySpark's modules from source
again. That is 0.6-0.7 s of CPU a process, against 0.27 s for the same imports from the
installed package. A ``millwheel run`` of the sample starts about ten such processes
while its queries start, on two cores (docs/performance.md, "The main job").

When pip installed PySpark, the package's directory is the Spark home, and the zip holds
the same code as the package beside it, already compiled. So for a local session,
:func:`local_spark_home` gives Spark another home: a directory of links to everything in
the package's home except that zip. The same Java, jars, scripts and configuration are
found as before. The workers run the driver's interpreter (``PYSPARK_PYTHON``), so they
find ``pyspark`` where the driver found it, with its bytecode.

* **When.** A ``local[...]`` master started by this process (not under spark-submit) with
  no ``SPARK_HOME`` in the environment (a home the user set is used as it is), and the
  workers of a cluster ``millwheel cluster up`` starts on this machine; PySpark in pip's
  layout (its directory has ``bin/spark-class``, ``jars/`` and the zip). py4j's
  zip is left out too when py4j is installed as a package (PySpark's pip dependency);
  otherwise it is linked.
* **Where.** ``<millwheel cache>/spark-home/<pyspark version>-<key>/``; the key is a
  hash of the package's directory, of the home's layout and of whether a ``javac`` was
  found (below). It is built once, in a temporary directory renamed into place, so a run
  never sees half of it. It holds links (``jars/`` one per jar) and the jar below, so a
  reinstall of the same version at the same path needs no rebuild.
* **Otherwise** (links not allowed, a read-only cache): Spark's own home, as before.

**Its local file system.** Without Hadoop's native library (pip's PySpark has none),
Hadoop's ``RawLocalFileSystem`` sets a permission by starting a ``chmod`` process: for
every file it creates and directory it makes, and again for the checksum file beside it.
Each micro-batch writes an offset log, a commit log, a log per file source and a state
file per key interval, so every query started ~16 processes a batch, ~9.5 ms a file on
the stream thread or in a task (docs/performance.md, "Latency"). When a ``javac`` is found
(beside ``$JAVA_HOME``'s ``java``, else on ``PATH``), the home's ``jars/`` also holds
``millwheel-localfs.jar``, compiled from ``java/NioLocalFileSystem.java``: the same file
system setting the same bits with ``java.nio``. :func:`local_fs_conf` makes it a local
session's ``file:`` file system; a session with ``spark.hadoop.fs.file.impl`` of its own
keeps that. Without a ``javac`` (a bare JRE) the home has no jar and Hadoop's own is used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from millwheel.runtime._cache import cache_dir

#: the zips Spark puts first on its Python processes' path, under ``python/lib``
PYSPARK_ZIP = "pyspark.zip"
#: the local file system without ``chmod`` processes (see above), and its jar in ``jars/``
LOCAL_FS_CLASS = "millwheel.hadoop.NioLocalFileSystem"
LOCAL_FS_JAR = "millwheel-localfs.jar"
_LOCAL_FS_SOURCE = Path(__file__).with_name("java") / "NioLocalFileSystem.java"
#: what a home holds changed (2: ``jars/`` a directory, with the local file system's jar)
_LAYOUT = 2


def _built(home: Path) -> bool:
    """Does ``home`` hold what Spark starts from (its scripts and jars, links followed)?"""
    return (home / "bin" / "spark-class").exists() and (home / "jars").is_dir()


def _package_home() -> Path | None:
    """PySpark's directory when pip installed it (a Spark home with the zip); else None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).resolve().parent
    return home if _built(home) and (home / "python" / "lib" / PYSPARK_ZIP).exists() else None


def _installed(module: str) -> bool:
    """Is ``module`` importable from a directory (compiled bytecode kept), not a zip?"""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and ".zip" + os.sep not in origin and os.path.isfile(origin)


def _left_out(lib: Path) -> set[str]:
    """The zips of ``python/lib`` the workers should not import from."""
    out = {PYSPARK_ZIP}
    if _installed("py4j"):
        out |= {p.name for p in lib.glob("py4j-*.zip")}
    return out


def _link_all(source: Path, target: Path, skip: set[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name not in skip:
            (target / entry.name).symlink_to(entry)


def jdk_binary(name: str) -> str | None:
    """Where ``bin/spark-class`` looks for the JDK's ``name``: ``$JAVA_HOME/bin`` when
    ``JAVA_HOME`` is set (whether or not it is there), else ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    return os.path.join(java_home, "bin", name) if java_home else shutil.which(name)


def _javac() -> str | None:
    """The Java compiler beside the JVM Spark starts (``$JAVA_HOME/bin``), else on ``PATH``."""
    found = jdk_binary("javac")
    return found if found and os.path.isfile(found) else shutil.which("javac")


def _compile_local_fs(jars: Path, javac: str, out: Path) -> None:
    """``out``: :data:`LOCAL_FS_CLASS` compiled against ``jars``' Hadoop, as a jar; no
    ``out`` when it does not compile (the home then keeps Hadoop's own)."""
    hadoop = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not hadoop:
        return
    with tempfile.TemporaryDirectory(prefix="millwheel-localfs-") as work:
        try:
            done = subprocess.run(
                [javac, "--release", "17", "-nowarn", "-cp", str(hadoop[-1]), "-d", work]
                + [str(_LOCAL_FS_SOURCE)],
                capture_output=True,
                timeout=300,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return
        classes = sorted(Path(work).rglob("*.class"))
        if done.returncode != 0 or not classes:
            return
        with zipfile.ZipFile(out, "w") as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for c in classes:
                jar.write(c, c.relative_to(work).as_posix())


def _build(home: Path, target: Path, javac: str | None) -> None:
    """Links to ``home``'s entries in ``target``; ``python/lib`` without the left-out zips;
    ``jars/`` a directory of links, with the local file system's jar if ``javac`` builds it."""
    _link_all(home, target, {"python", "jars"})
    _link_all(home / "jars", target / "jars", set())
    if javac is not None:
        _compile_local_fs(home / "jars", javac, target / "jars" / LOCAL_FS_JAR)
    _link_all(home / "python", target / "python", {"lib"})
    lib = home / "python" / "lib"
    _link_all(lib, target / "python" / "lib", _left_out(lib))


def local_fs_conf(home: str | None) -> dict[str, str]:
    """The session settings that make ``home``'s local file system Spark's ``file:`` one
    (none when ``home`` has no :data:`LOCAL_FS_JAR`: not built here, or no ``javac``)."""
    if home is None or not (Path(home) / "jars" / LOCAL_FS_JAR).is_file():
        return {}
    return {"spark.hadoop.fs.file.impl": LOCAL_FS_CLASS}


def local_spark_home() -> str | None:
    """A Spark home on this machine whose Python processes import compiled PySpark.

    Returns None (keep Spark's own) when PySpark is not in pip's layout, or the links
    cannot be made. The caller leaves a ``SPARK_HOME`` the user set as it is.
    """
    home = _package_home()
    if home is None:
        return None
    import pyspark

    javac = _javac()
    # a home per installation, layout, and whether a compiler could build its file system
    # (one installed later gets a home with it)
    what = f"{home}\0{_LAYOUT}\0{javac is not None}"
    key = hashlib.sha256(what.encode()).hexdigest()[:12]
    target = cache_dir() / "spark-home" / f"{pyspark.__version__}-{key}"
    if _built(target):
        return str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            _build(home, tmp, javac)
            tmp.chmod(0o755)  # as any directory of the installation (``mkdtemp`` makes it private)
            os.rename(tmp, target)  # atomic; fails if another process put it there first
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not _built(target):  # not another process's home, renamed into place first
                raise
    except OSError:
        return None
    return str(target)
