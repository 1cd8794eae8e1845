"""The Spark home of a local session (``millwheel/runtime/_worker_home.py``): the same
installation without ``pyspark.zip``, so Spark's Python processes import compiled PySpark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from millwheel.runtime import _cds as cds
from millwheel.runtime import _worker_home as wh


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cds.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _package_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def test_the_home_links_the_installation_without_the_zip(cache):
    home = wh.local_spark_home()
    assert home is not None and Path(home).parent == cache / "spark-home"
    real = _package_home()
    for entry in ("bin", "jars"):
        assert (Path(home) / entry).resolve() == (real / entry).resolve()
    assert (Path(home) / "bin" / "spark-class").exists()
    lib = Path(home) / "python" / "lib"
    assert (real / "python" / "lib" / wh.PYSPARK_ZIP).exists()  # what is left out exists
    assert not (lib / wh.PYSPARK_ZIP).exists()
    # py4j is pip-installed beside PySpark here: its zip is left out too
    assert not list(lib.glob("py4j-*.zip")) and list((real / "python" / "lib").glob("py4j-*.zip"))
    # built once: a second call finds it, whatever is in the cache directory beside it
    assert wh.local_spark_home() == home
    assert [p.name for p in (cache / "spark-home").iterdir()] == [Path(home).name]


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
    monkeypatch.setenv(cds.CACHE_ENV, str(tmp_path))
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
