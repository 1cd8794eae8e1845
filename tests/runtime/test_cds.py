"""The driver JVM's class-data archive (``millwheel/runtime/_cds.py``): where it is, when
it is used, and that a damaged one never stops Spark from starting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from millwheel.runtime import _cds as cds
from millwheel.runtime._cache import CACHE_ENV


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(cds.CDS_ENV, raising=False)
    return tmp_path / "cache"


def test_the_archive_is_per_java_and_pyspark_installation(cache, tmp_path, monkeypatch):
    path = cds.archive_path()
    assert (
        path is not None
        and path.parent == cache / "cds"
        and path.name.startswith("spark-")
        and path.suffix == ".jsa"
    )
    assert cds.java_options() == ""  # not built: nothing to map
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    assert cds.java_options() == f"-XX:SharedArchiveFile={path} {cds.QUIET}"
    monkeypatch.setenv(cds.CDS_ENV, "0")
    assert cds.java_options() == ""
    monkeypatch.delenv(cds.CDS_ENV)
    # another Java binary: another archive
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    other = cds.archive_path()
    assert other is not None and other != path and other.parent == path.parent


def test_set_aside_moves_only_the_named_archive(cache):
    path = cds.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    cds.set_aside(f"-Xmx1g -XX:SharedArchiveFile={path} {cds.QUIET}")
    assert not path.exists() and Path(f"{path}.failed").exists()
    cds.set_aside("-Xmx1g")  # no archive named: nothing happens


START = """
from millwheel.runtime._session import spark_session
spark = spark_session("local[1]")
print("sum", spark.range(10).selectExpr("sum(id)").collect()[0][0], flush=True)
"""


@pytest.mark.spark
def test_a_damaged_archive_is_set_aside_and_spark_starts_without_it(tmp_path, monkeypatch):
    """An archive cut short (a copy or a build stopped half way, a full disk) makes the JVM
    die at start, always: it maps the archive's regions and touches pages past the file's
    end (SIGBUS; checked by hand at 64 KB, 1 MB and 50 MB of a 180 MB archive). The session
    starts again without it and sets it aside. Damage inside a whole file is not a test:
    whether the JVM touches the damaged bytes depends on the build's layout (a test that
    overwrote 2 MB in the middle passed here and failed in CI, where the JVM started)."""
    built = cds.archive_path()
    if built is None or not built.is_file():
        pytest.skip("no class-data archive built here (scripts/setup.sh builds it)")
    # where the run below looks for its archive: its cache's, keyed by the home it builds there
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    env = {**os.environ}
    env.pop(cds.CDS_ENV, None)
    damaged = cds.archive_path()
    assert damaged is not None and damaged.parent == tmp_path / "cache" / "cds"
    damaged.parent.mkdir(parents=True)
    with built.open("rb") as f:
        damaged.write_bytes(f.read(built.stat().st_size // 2))
    # the crashed JVM writes its hs_err file into the working directory
    run = subprocess.run(
        [sys.executable, "-c", START],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sum 45" in run.stdout
    assert not damaged.exists() and Path(f"{damaged}.failed").exists()
