"""The ``harness`` fixture of millwheel's pytest plugin: installed with millwheel, no conftest needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from millwheel import MillwheelError
from millwheel.testing.pytest_plugin import HarnessFactory

USER_TESTS = """
from millwheel import Computation, SampleSource, Topology

class Upper(Computation):
    def process_record(self, record):
        self.produce("upper", record.value.upper())

def test_a_computation(harness):
    h = harness(Upper, inputs={"words": lambda r: r.value}, outputs=["upper"])
    h.inject("words", [h.record("cats", 1), h.record("dogs", 2)])
    h.run()
    assert h.values("upper") == ["CATS", "DOGS"]

class Shout(Computation):
    def process_record(self, record):
        self.produce("upper", record.value["w"].upper() + "!")

def test_a_topology(harness):
    t = Topology("t")
    t.injector("words", SampleSource([{"w": "hi", "ts": 1}], timestamp="ts"))
    t.computation(Shout, inputs={"words": lambda r: r.value["w"]}, outputs=["upper"])
    h = harness(t)
    h.run_sources()
    assert h.values("upper") == ["HI!"]

def test_user_code_errors_raise_in_a_test(harness):
    import pytest
    h = harness(Upper, inputs={"words": lambda r: r.value}, outputs=["upper"])
    h.inject("words", [h.record(42, 1)])
    with pytest.raises(AttributeError):
        h.run()
"""


def test_the_plugin_is_registered_as_a_pytest_entry_point():
    assert "millwheel.testing.pytest_plugin" in {ep.value for ep in entry_points(group="pytest11")}


def test_a_users_test_file_uses_the_fixture_without_a_conftest(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_the_fixture_says_what_it_takes():
    with pytest.raises(
        MillwheelError,
        match="takes a Computation subclass .* a Topology or the path of a topology module",
    ):
        HarnessFactory()(42)
