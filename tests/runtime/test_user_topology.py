"""The user's path on Spark: a topology file of their own, run with ``millwheel run``.

* The README's example, verbatim, saved as the user would (``counts.py``), with its
  ``Computation`` class defined in that file and a helper module imported from the same
  directory: classes and functions of the topology file are shipped to Spark's workers
  by value, sibling modules by path.
* A package of the user's installed in development mode (``pip install -e``: found by an
  import finder, not by a ``sys.path`` entry), run from another directory: its classes
  reach the workers by name, so plain ``pickle`` of their instances works there.
* A computation whose constructor fails in the workers: the run stops after one retry
  with the Python traceback as the message, not twenty restarts and thousands of lines of
  Java traces.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"
MILLWHEEL = str(Path(sys.executable).with_name("millwheel"))


def _run(
    tmp_path: Path,
    topology_file: Path,
    *extra: str,
    timeout: float = 300,
    cwd: Path | None = None,
    pythonpath: str = "",
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(
        [
            MILLWHEEL,
            "run",
            str(topology_file),
            "--until-drained",
            "--checkpoint",
            str(tmp_path / "run"),
            "--intervals",
            "2",
            "--status-every",
            "0",
            *extra,
        ],
        cwd=cwd or tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_readme_example_runs_verbatim_on_spark(tmp_path):
    block = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    path = tmp_path / "counts.py"
    path.write_text(block)
    done = _run(tmp_path, path)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("('cats', 1000, 1)", "('dogs', 1000, 1)", "('cats', 2000, 1)"):
        assert line in done.stdout, done.stdout


def test_a_sibling_module_of_the_topology_file_reaches_the_workers(tmp_path):
    (tmp_path / "my_helpers.py").write_text("def shout(text):\n    return text.upper() + '!'\n")
    path = tmp_path / "shouting.py"
    path.write_text(
        textwrap.dedent(
            """
        from millwheel import Computation, SampleSource, Topology
        from my_helpers import shout

        class Shout(Computation):
            def process_record(self, record):
                self.produce("shouts", shout(record.value["word"]))

        topology = Topology("shouting")
        topology.injector("words", SampleSource([{"word": "hi", "ts": 1}, {"word": "ho", "ts": 2}], timestamp="ts"))
        topology.computation(Shout, inputs={"words": lambda r: r.value["word"]}, outputs=["shouts"])
        topology.sink("shouts")
        """
        )
    )
    done = _run(tmp_path, path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HI!" in done.stdout and "HO!" in done.stdout


#: what ``pip install -e`` leaves in site-packages, in short: a finder on ``sys.meta_path``
#: that knows where the package's source is (here a ``sitecustomize`` on the workers'
#: ``PYTHONPATH`` installs it, in the driver and in every worker)
EDITABLE_FINDER = """
import importlib.abc, importlib.util, sys

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tallies":
            return None  # its submodules: through the package's __path__
        return importlib.util.spec_from_file_location(
            name, {src!r} + "/tallies/__init__.py", submodule_search_locations=[{src!r} + "/tallies"]
        )

sys.meta_path.append(_Finder())
"""


def test_a_package_installed_in_development_mode_reaches_the_workers_by_name(tmp_path):
    src, site, app, elsewhere = (tmp_path / d for d in ("src", "site", "app", "elsewhere"))
    (src / "tallies").mkdir(parents=True)
    for d in (site, app, elsewhere):
        d.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(src=str(src)))
    (src / "tallies" / "__init__.py").write_text("")
    (src / "tallies" / "counting.py").write_text(
        textwrap.dedent(
            """
        import pickle
        from dataclasses import dataclass

        from millwheel import Computation


        @dataclass
        class Tally:
            n: int = 0


        class Count(Computation):
            def process_record(self, record):
                # pickled by its own code, as a columnar computation stores objects in a
                # binary column: plain pickle finds the class by name
                tally = pickle.loads(self.state.get(pickle.dumps(Tally())))
                tally.n += 1
                self.state.set(pickle.dumps(tally))
                self.produce("tallies", (self.key, tally.n))
        """
        )
    )
    path = app / "topology.py"
    path.write_text(
        textwrap.dedent(
            """
        from millwheel import SampleSource, Topology
        from tallies.counting import Count

        words = [{"word": w, "ts": i} for i, w in enumerate(["hi", "ho", "hi"])]
        topology = Topology("tallying")
        topology.injector("words", SampleSource(words, timestamp="ts"))
        topology.computation(Count, inputs={"words": lambda r: r.value["word"]}, outputs=["tallies"])
        topology.sink("tallies")
        """
        )
    )
    done = _run(tmp_path, path, cwd=elsewhere, pythonpath=str(site))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dead letters" not in done.stdout, done.stdout
    for line in ("('hi', 1)", "('ho', 1)", "('hi', 2)"):
        assert line in done.stdout, done.stdout


def test_a_deterministic_worker_failure_stops_with_the_python_traceback(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(
        textwrap.dedent(
            """
        from millwheel import Computation, SampleSource, Topology

        class NeedsAModel(Computation):
            def setup(self):
                raise FileNotFoundError("model file models/ctr.bin is missing")

            def process_record(self, record):
                pass

        topology = Topology("broken")
        topology.injector("words", SampleSource([{"word": "hi", "ts": 1}], timestamp="ts"))
        topology.computation(NeedsAModel, inputs={"words": lambda r: r.value["word"]})
        """
        )
    )
    done = _run(tmp_path, path, timeout=240)  # gives up, rather than retrying a broken run for ever
    assert done.returncode != 0
    assert "model file models/ctr.bin is missing" in done.stderr
    assert "not retried again" in done.stderr
    assert done.stderr.count("\n") < 150, done.stderr[-3000:]


def test_a_spark_run_says_how_many_records_were_late_and_the_lateness_that_keeps_them(
    tmp_path, late_log_topology
):
    # the harness twin is in tests/test_cli.py: the same words, the same counts
    path, _ = late_log_topology
    done = _run(tmp_path, path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "warning: Count: 30 records late (5.00% of 600), 30 dropped; injector logs read records up to 3.0s out of order "
        "(events-2026-01-01T10-00-30.jsonl): LogFileSource(lateness_ms=3000) would have kept them"
    ) in done.stdout, done.stdout
    assert done.stdout.count("records late") == 1, (
        done.stdout
    )  # the final table leaves it to the summary
