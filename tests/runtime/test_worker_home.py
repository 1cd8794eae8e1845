"""The Spark home of a local session (``millwheel/runtime/_worker_home.py``): the same
installation without ``pyspark.zip``, so Spark's Python processes import compiled PySpark."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from millwheel.runtime import _worker_home as wh
from millwheel.runtime._cache import CACHE_ENV


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _package_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def test_the_home_links_the_installation_without_the_zip(cache):
    home = wh.local_spark_home()
    assert home is not None and Path(home).parent == cache / "spark-home"
    real = _package_home()
    assert (Path(home) / "bin").resolve() == (real / "bin").resolve()
    jars = {p.name for p in (real / "jars").iterdir()}
    linked = {p.name for p in (Path(home) / "jars").iterdir() if p.is_symlink()}
    assert linked == jars  # every jar, each a link; the local file system's jar beside them
    assert (Path(home) / "bin" / "spark-class").exists()
    lib = Path(home) / "python" / "lib"
    assert (real / "python" / "lib" / wh.PYSPARK_ZIP).exists()  # what is left out exists
    assert not (lib / wh.PYSPARK_ZIP).exists()
    # py4j is pip-installed beside PySpark here: its zip is left out too
    assert not list(lib.glob("py4j-*.zip")) and list((real / "python" / "lib").glob("py4j-*.zip"))
    # built once: a second call finds it, whatever is in the cache directory beside it
    assert wh.local_spark_home() == home
    assert [p.name for p in (cache / "spark-home").iterdir()] == [Path(home).name]


def test_the_home_holds_the_local_file_system_when_javac_is_found(cache):
    if wh._javac() is None:
        pytest.skip("no javac here: the home keeps Hadoop's own file system (tested below)")
    home = wh.local_spark_home()
    jar = Path(home) / "jars" / wh.LOCAL_FS_JAR
    assert jar.is_file() and not jar.is_symlink()
    names = set(zipfile.ZipFile(jar).namelist())
    assert {
        "millwheel/hadoop/NioLocalFileSystem.class",
        "millwheel/hadoop/NioLocalFileSystem$Raw.class",
    } <= names
    assert wh.local_fs_conf(home) == {"spark.hadoop.fs.file.impl": wh.LOCAL_FS_CLASS}


def test_without_javac_the_home_keeps_hadoops_file_system(cache, monkeypatch):
    with_javac = wh.local_spark_home() if wh._javac() is not None else None
    monkeypatch.setattr(wh, "_javac", lambda: None)
    home = wh.local_spark_home()
    assert home is not None and home != with_javac  # a home of its own: no jar, no setting
    assert not (Path(home) / "jars" / wh.LOCAL_FS_JAR).exists()
    assert wh.local_fs_conf(home) == {} and wh.local_fs_conf(None) == {}


def test_a_source_that_does_not_compile_leaves_no_jar(cache, monkeypatch, tmp_path):
    if wh._javac() is None:
        pytest.skip("no javac here")
    broken = tmp_path / "NioLocalFileSystem.java"
    broken.write_text("package millwheel.hadoop; class Broken {")
    monkeypatch.setattr(wh, "_LOCAL_FS_SOURCE", broken)
    home = wh.local_spark_home()
    assert home is not None and (Path(home) / "bin" / "spark-class").exists()
    assert not (Path(home) / "jars" / wh.LOCAL_FS_JAR).exists() and wh.local_fs_conf(home) == {}


def test_py4j_zip_is_kept_when_py4j_is_not_installed_as_a_package(cache, monkeypatch):
    monkeypatch.setattr(wh, "_installed", lambda _module: False)
    home = wh.local_spark_home()
    assert home is not None
    lib = Path(home) / "python" / "lib"
    assert list(lib.glob("py4j-*.zip")) and not (lib / wh.PYSPARK_ZIP).exists()


def test_without_links_spark_keeps_its_own_home(cache, monkeypatch):
    def refuse(self, target, target_is_directory=False):
        msg = "symbolic links not allowed here"
        raise OSError(msg)

    monkeypatch.setattr(Path, "symlink_to", refuse)
    assert wh.local_spark_home() is None
    # nothing half-built is left for the next run to take
    assert not [p for p in (cache / "spark-home").iterdir()]


def test_a_home_that_is_not_pips_layout_is_not_replaced(monkeypatch, tmp_path):
    monkeypatch.setattr(wh, "_package_home", lambda: None)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert wh.local_spark_home() is None


@pytest.mark.spark
def test_local_workers_import_the_installed_pyspark_not_the_zip(spark):
    """The session's own Python workers: ``pyspark`` from the package directory, compiled."""
    home = os.environ.get("SPARK_HOME", "")
    assert not (Path(home) / "python" / "lib" / wh.PYSPARK_ZIP).exists()

    def where(_):
        import sys

        import pyspark

        return pyspark.__file__, [p for p in sys.path if p.endswith(".zip")]

    origin, zips = spark.sparkContext.parallelize([0], 1).map(where).collect()[0]
    assert Path(origin).resolve().parent == _package_home()
    assert not any(Path(z).exists() for z in zips), (
        zips
    )  # a zip on the path is one that is not there


@pytest.mark.spark
def test_a_local_session_sets_permissions_with_its_own_file_system(spark, tmp_path):
    """The session's ``file:`` file system is the home's (no ``chmod`` process a file):
    a file and a directory made with a permission get exactly its bits, as Hadoop's own
    would set them, and a file made without one gets the default under the umask."""
    home = os.environ.get("SPARK_HOME", "")
    if not (Path(home) / "jars" / wh.LOCAL_FS_JAR).is_file():
        pytest.skip("this session's home has no local file system jar (no javac at set-up)")
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    assert conf.get("fs.file.impl") == wh.LOCAL_FS_CLASS
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == wh.LOCAL_FS_CLASS
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission

    def path(name):
        return jvm.org.apache.hadoop.fs.Path(str(tmp_path / name))

    assert fs.mkdirs(path("d/e"), perm(0o750))
    out = fs.create(path("f"), perm(0o640), True, 4096, 1, 1 << 20, None)
    out.write(b"x")
    out.close()
    plain = fs.create(path("g"), True)
    plain.close()
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "d" / "e").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640 and (
        tmp_path / "f"
    ).read_bytes() == b"x"
    assert (tmp_path / "g").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / ".f.crc").exists()  # still Hadoop's checksummed local file system
    fs.setPermission(path("g"), perm(0o1644))  # the sticky bit: left to Hadoop's own code
    assert (tmp_path / "g").stat().st_mode & 0o1777 == 0o1644
